package policy

import (
	"fmt"
	"github.com/gpuguard/gpuguard/policy/celexpr"
	"strings"
)

// checkDeviceEnv is the rule device-env: explicit device lists.
//
// Fields read, in every container kind (init, sidecar, regular, ephemeral):
//   - env[*].name and env[*].value, for NVIDIA_VISIBLE_DEVICES and the policy's
//     env.extraDeviceVariables (such as the toolkit's swarm-resource variable).
//
// Allowed values:
//   - containers without GPU resources: "void", "" and "none". The mutating phase
//     rewrites "none" to "void": toolkit 1.18.0-1.18.1 in jit-cdi mode gave every GPU
//     for "none";
//   - GPU containers: "void" and "" only. Any other value, "none" included, replaces
//     the device plugin's allocation, because pod env is applied after it.
//
// Every entry counts, not only the last one, which wins at run time. Entries set
// through valueFrom are judged by env-value-from. Default action: deny (or strip).
func checkDeviceEnv(in *Input, c *containerRef) []Finding {
	var out []Finding
	var env envFolder
	for i := range c.c.Env {
		v := &c.c.Env[i]
		if v.ValueFrom != nil || !in.e.isDeviceVar(v.Name) {
			continue
		}
		if problem := deviceEnvProblem(c.gpu, v.Name, v.Value); problem != "" {
			out = env.add(out, envFinding(RuleDeviceEnv, c, i, "%s", problem))
		} else if v.Value == "none" && in.mutable {
			out = append(out, editOf(RuleDeviceEnv, c, edit{kind: editVoidValue, index: i}))
		}
	}
	return out
}

// voidValue makes the NVIDIA runtime behave like runc: no devices, no driver.
const voidValue = "void"

// deviceEnvProblem judges one literal assignment to a device variable; "" means fine.
func deviceEnvProblem(gpu bool, name, value string) string {
	switch {
	case value == voidValue || value == "":
		return ""
	case !gpu && value == "none":
		return ""
	case gpu:
		return fmt.Sprintf("sets %s=%s over its GPU allocation; remove it", name, quote(value))
	}
	return fmt.Sprintf("sets %s=%s without a GPU limit; remove it or add a GPU limit", name, quote(value))
}

// RuleDeviceEnv is the rule of checkDeviceEnv.
const RuleDeviceEnv RuleID = "device-env"

func init() {
	register(&Rule{
		ID: RuleDeviceEnv,
		Summary: "a non-GPU container setting `NVIDIA_VISIBLE_DEVICES` (or an extra device variable) to anything but `void`, `\"\"` or `none` " +
			"(`none` is rewritten to `void`: toolkit 1.18.0–1.18.1 leaked every GPU for it); a GPU container setting it to anything but `void` or `\"\"`. " +
			"Every entry counts, not only the last",
		Order: 110, ContainerCheck: checkDeviceEnv,
		// Any device variable that is not a literal void or "": those the rule
		// denies, and "none", which the webhook rewrites to void.
		Trigger: func(in *CELInput) *CELTrigger {
			return &CELTrigger{Env: fmt.Sprintf(`e.name in %s && (has(e.valueFrom) || (has(e.value) && e.value != "void"))`,
				celexpr.List(in.DeviceVars)), EnvNames: in.DeviceVars}
		},
		CEL: func(in *CELInput) *CELCheck {
			return &CELCheck{Plain: deviceEnvCEL(in, false), GPU: deviceEnvCEL(in, true),
				Message: "sets " + strings.Join(in.DeviceVars, " or ") + " to a value that grants GPUs; remove it"}
		},
	})
}

// deviceEnvCEL: an entry of a device variable with a granting literal value;
// on a container without GPUs "none" is not granting (the webhook rewrites
// it).
func deviceEnvCEL(in *CELInput, gpu bool) string {
	allowed := `["void", "", "none"]`
	if gpu {
		allowed = `["void", ""]`
	}
	return fmt.Sprintf(`has(c.env) && c.env.exists(e, e.name in %s && !has(e.valueFrom) && has(e.value) && !(e.value in %s))`,
		celexpr.List(in.DeviceVars), allowed)
}
