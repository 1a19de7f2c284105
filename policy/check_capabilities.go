package policy

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// checkCapabilities is the advisory rule capabilities.
//
// Fields read, in every container kind:
//   - securityContext.capabilities.add.
//
// Allowed values: no SYS_ADMIN or ALL (with or without CAP_) among the added
// capabilities. The NVIDIA Container Toolkit counts CAP_SYS_ADMIN in the bounding
// set as privileged and honours device requests from the environment of such a
// container even where the node refuses them from unprivileged ones; the device
// cgroup still holds, so the container opens only what the runtime gave it.
// Nsight profiling and FUSE need SYS_ADMIN. Default: warn (advisories.capabilities).
func checkCapabilities(ev *evaluation, c *containerRef) {
	sc := c.c.SecurityContext
	if sc == nil || sc.Capabilities == nil || (sc.Privileged != nil && *sc.Privileged) {
		return
	}
	for i, capability := range sc.Capabilities.Add {
		if grantsDevices(capability) {
			ev.report(RuleCapabilities, severityEffect(ev.e.policy.Spec.Advisories.Capabilities), c,
				c.path().Child("securityContext", "capabilities", "add").Index(i).String(),
				"container %q adds %s, which the NVIDIA runtime treats as privileged", c.c.Name, capability)
			return
		}
	}
}

func grantsDevices(c corev1.Capability) bool {
	name := strings.TrimPrefix(strings.ToUpper(string(c)), "CAP_")
	return name == "SYS_ADMIN" || name == "ALL"
}
