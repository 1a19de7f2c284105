package policy

import (
	"fmt"
	"github.com/gpuguard/gpuguard/policy/celexpr"
	"slices"

	"github.com/gpuguard/gpuguard/config"
)

// checkNVIDIARuntimeClass is the advisory rule nvidia-runtime-class.
//
// Fields read:
//   - spec.runtimeClassName, and the resources.limits of every container.
//
// Allowed values: any runtime class, except that a pod without a GPU container
// should not ask for one of the policy's nvidiaRuntimeClasses (default nvidia,
// nvidia-cdi, nvidia-legacy): in CDI-mode clusters only that runtime reads device
// requests from the environment. Default: warn (advisories.nvidiaRuntimeClass).
func checkNVIDIARuntimeClass(in *Input) []Finding {
	rc := in.t.spec.RuntimeClassName
	if rc == nil || !in.e.runtimeClasses[*rc] {
		return nil
	}
	if slices.ContainsFunc(in.containers, func(c containerRef) bool { return c.gpu }) {
		return nil
	}
	return []Finding{podFinding(RuleNVIDIARuntimeClass, severityEffect(in.e.policy.Spec.Advisories.NVIDIARuntimeClass),
		in.t.specPath.Child("runtimeClassName").String(),
		"%s without a GPU limit; remove it or request a GPU", quote(*rc))}
}

func severityEffect(s config.Severity) effect {
	if s == config.SeverityDeny {
		return effectDeny
	}
	return effectWarn
}

// RuleNVIDIARuntimeClass is the rule of checkNVIDIARuntimeClass.
const RuleNVIDIARuntimeClass RuleID = "nvidia-runtime-class"

func init() {
	register(&Rule{
		ID:      RuleNVIDIARuntimeClass,
		Summary: "advisory: an NVIDIA runtime class on a pod without a GPU limit (warn by default)",
		Order:   40, PodCheck: checkNVIDIARuntimeClass, PodScopes: []scope{scopePod, scopeTemplate},
		// Any severity, GPU containers or not.
		Trigger: func(in *CELInput) *CELTrigger {
			return &CELTrigger{Pod: fmt.Sprintf(`has(object.spec.runtimeClassName) && object.spec.runtimeClassName in %s`,
				celexpr.List(in.Policy.Spec.NVIDIARuntimeClasses))}
		},
		Gap: "warnings: rendered only when the policy's severity is `deny`",
		CEL: func(in *CELInput) *CELCheck {
			if in.Policy.Spec.Advisories.NVIDIARuntimeClass != config.SeverityDeny {
				return nil
			}
			return &CELCheck{Message: "uses an NVIDIA runtime class without a GPU limit",
				Pod: fmt.Sprintf(`request.operation == "CREATE" && has(object.spec.runtimeClassName) && object.spec.runtimeClassName in %s && %s`,
					celexpr.List(in.Policy.Spec.NVIDIARuntimeClasses), in.NoGPUContainer)}
		},
	})
}
