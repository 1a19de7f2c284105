package policy

import (
	"fmt"
	"github.com/gpuguard/gpuguard/policy/celexpr"
	"slices"
	"strings"
)

// checkProtectedEnv is the rule protected-env: variables that grant devices or
// driver features.
//
// Fields read, in every container kind:
//   - env[*].name and env[*].value, for the policy's env.protectedVariables
//     (by default NVIDIA_DRIVER_CAPABILITIES, NVIDIA_MIG_CONFIG_DEVICES,
//     NVIDIA_MIG_MONITOR_DEVICES, NVIDIA_IMEX_CHANNELS, NVIDIA_GDS, NVIDIA_MOFED,
//     NVIDIA_NVSWITCH and NVIDIA_GDRCOPY).
//
// Allowed values:
//   - containers without GPU resources: none of these variables;
//   - GPU containers (KAI fraction containers among them, with the
//     integration on): only variables with allowOnGPUContainers, and then, if the
//     entry lists allowedValues, a comma-separated value made of those items only
//     (by default NVIDIA_DRIVER_CAPABILITIES with compute, compat32, graphics,
//     utility, video, display, ngx, all).
//
// Default action: deny (or strip).
func checkProtectedEnv(in *Input, c *containerRef) []Finding {
	var out []Finding
	var env envFolder
	for i := range c.c.Env {
		v := &c.c.Env[i]
		if v.ValueFrom != nil {
			continue
		}
		if problem := in.e.protectedEnvProblem(in.gpuFeatures(c), v.Name, v.Value); problem != "" {
			out = env.add(out, envFinding(RuleProtectedEnv, c, i, "%s", problem))
		}
	}
	return out
}

// ProtectedEnvProblem judges one assignment of a protected variable as
// admission does, for a container with GPUs (gpu) or without; "" means
// fine or not protected. The node enforcer judges final environments with it.
func (e *Engine) ProtectedEnvProblem(gpu bool, name, value string) string {
	return e.protectedEnvProblem(gpu, name, value)
}

// protectedEnvProblem judges one literal assignment; "" means fine or not protected.
func (e *Engine) protectedEnvProblem(gpu bool, name, value string) string {
	p := e.protected[name]
	switch {
	case p == nil:
		return ""
	case !gpu:
		return fmt.Sprintf("sets %s without a GPU limit; remove it", name)
	case !p.AllowOnGPUContainers:
		return fmt.Sprintf("sets %s, which the policy allows no workload; remove it", name)
	}
	if len(p.AllowedValues) == 0 {
		return ""
	}
	for item := range strings.SplitSeq(value, ",") {
		item = strings.TrimSpace(item)
		if item != "" && !slices.Contains(p.AllowedValues, item) {
			return fmt.Sprintf("sets %s with %s; allowed: %s", name, quote(item), strings.Join(p.AllowedValues, ","))
		}
	}
	return ""
}

// RuleProtectedEnv is the rule of checkProtectedEnv.
const RuleProtectedEnv RuleID = "protected-env"

func init() {
	register(&Rule{
		ID:      RuleProtectedEnv,
		Summary: "protected variables where the policy does not allow them",
		Order:   120, ContainerCheck: checkProtectedEnv,
		// The CEL form, per entry: a protected variable set, and for a GPU
		// container (whose resources are read only then) one it may not
		// have or with a value it may not take.
		Trigger: func(in *CELInput) *CELTrigger {
			all, gpu := protectedEnvViolations(in)
			return &CELTrigger{Env: fmt.Sprintf("!has(e.valueFrom) && e.name in %s && (!(%s) || (%s))", celexpr.List(all), in.IsGPU, gpu),
				EnvNames: all}
		},
		CEL: func(in *CELInput) *CELCheck {
			// A KAI fraction container is judged as a GPU container.
			plain := protectedEnvCEL(in, false)
			if kai := KAIFractionCEL(in.Policy); kai != "false" {
				plain = fmt.Sprintf(`(%s ? %s : %s)`, kai, protectedEnvCEL(in, true), plain)
			}
			return &CELCheck{Plain: plain, GPU: protectedEnvCEL(in, true),
				Message: "sets a protected NVIDIA variable the policy does not allow it; remove it"}
		},
	})
}

// protectedEnvCEL: a protected variable where the policy does not allow it:
// on a container without GPUs, any; on a GPU container, one not allowed there
// or with a value outside its allowedValues.
func protectedEnvCEL(in *CELInput, gpu bool) string {
	all, gpuViolation := protectedEnvViolations(in)
	violation := fmt.Sprintf("e.name in %s", celexpr.List(all))
	if gpu {
		violation = gpuViolation
	}
	return fmt.Sprintf(`has(c.env) && c.env.exists(e, !has(e.valueFrom) && (%s))`, violation)
}

// protectedEnvViolations are the protected variables' names, and the
// predicate over an env entry e that breaks the rule in a GPU container.
func protectedEnvViolations(in *CELInput) (all []string, gpu string) {
	var nowhere, badValue []string
	for _, v := range in.Policy.Spec.Env.ProtectedVariables {
		all = append(all, v.Name)
		switch {
		case !v.AllowOnGPUContainers:
			nowhere = append(nowhere, v.Name)
		case len(v.AllowedValues) > 0:
			badValue = append(badValue, fmt.Sprintf(`e.name == %s && has(e.value) && e.value.split(",").exists(x, x.trim() != "" && !(x.trim() in %s))`,
				celexpr.Str(v.Name), celexpr.List(v.AllowedValues)))
		}
	}
	return all, celexpr.Or(append([]string{fmt.Sprintf("e.name in %s", celexpr.List(nowhere))}, badValue...)...)
}
