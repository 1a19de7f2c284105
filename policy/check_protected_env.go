package policy

import (
	"fmt"
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
//   - GPU containers: only variables with allowOnGPUContainers, and then, if the
//     entry lists allowedValues, a comma-separated value made of those items only
//     (by default NVIDIA_DRIVER_CAPABILITIES with compute, compat32, graphics,
//     utility, video, display, ngx, all).
//
// Default action: deny (or strip).
func checkProtectedEnv(ev *evaluation, c *containerRef) {
	for i := range c.c.Env {
		v := &c.c.Env[i]
		if v.ValueFrom != nil {
			continue
		}
		if problem := ev.e.protectedEnvProblem(c.gpu, v.Name, v.Value); problem != "" {
			ev.reportEnv(RuleProtectedEnv, c, i, "container %q %s", c.c.Name, problem)
		}
	}
}

// protectedEnvProblem judges one literal assignment; "" means fine or not protected.
func (e *Engine) protectedEnvProblem(gpu bool, name, value string) string {
	p := e.protected[name]
	switch {
	case p == nil:
		return ""
	case !gpu:
		return fmt.Sprintf("has no GPU limit but sets %s; remove it", name)
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
