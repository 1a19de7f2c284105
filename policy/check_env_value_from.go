package policy

import (
	"fmt"
	"github.com/gpuguard/gpuguard/policy/celexpr"
)

// checkEnvValueFrom is the rule env-value-from: protected variables whose value is
// not known at admission.
//
// Fields read, in every container kind:
//   - env[*].name and env[*].valueFrom, for every device variable and protected
//     variable.
//
// Allowed values: none. A value from configMapKeyRef, secretKeyRef, fieldRef,
// resourceFieldRef or fileKeyRef is resolved by the kubelet at container start, after
// admission, and could grant anything. Default action: deny (or strip). The one
// exception, with spec.integrations.kaiScheduler.fractions on, is the entry KAI
// Scheduler's admission gives a fraction container (kai.go), whose ConfigMap only
// KAI's binder may write.
func checkEnvValueFrom(in *Input, c *containerRef) []Finding {
	var out []Finding
	var env envFolder
	for i := range c.c.Env {
		v := &c.c.Env[i]
		if v.ValueFrom == nil || !in.e.isProtectedName(v.Name) || in.kaiFractionRef(c, v) {
			continue
		}
		out = env.add(out, envFinding(RuleEnvValueFrom, c, i,
			"sets %s by valueFrom, unknown at admission; use a literal value or remove it", v.Name))
	}
	return out
}

// isProtectedName reports whether name is a device variable or a protected variable.
func (e *Engine) isProtectedName(name string) bool {
	return e.isDeviceVar(name) || e.protected[name] != nil
}

// RuleEnvValueFrom is the rule of checkEnvValueFrom.
const RuleEnvValueFrom RuleID = "env-value-from"

func init() {
	register(&Rule{
		ID:      RuleEnvValueFrom,
		Summary: "a protected name set through `valueFrom` (its value is unknown at admission)",
		Order:   130, ContainerCheck: checkEnvValueFrom,
		// The CEL form, per entry.
		Trigger: func(in *CELInput) *CELTrigger {
			return &CELTrigger{Env: fmt.Sprintf(`e.name in %s && has(e.valueFrom)`, celexpr.List(in.Protected)), EnvNames: in.Protected}
		},
		CEL: func(in *CELInput) *CELCheck {
			pred := envValueFromCEL(in)
			return &CELCheck{Plain: pred, GPU: pred, Message: "sets a protected NVIDIA variable through valueFrom; use a literal value or remove it"}
		},
	})
}

func envValueFromCEL(in *CELInput) string {
	return fmt.Sprintf(`has(c.env) && c.env.exists(e, e.name in %s && has(e.valueFrom) && !%s)`,
		celexpr.List(in.Protected), KAIFractionRefCEL(in.Policy, "e"))
}
