package policy

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// checkPrivileged is the advisory rule privileged.
//
// Fields read, in every container kind:
//   - securityContext.privileged;
//   - securityContext.capabilities.add.
//
// Allowed values: privileged unset or false, and no SYS_ADMIN or ALL among the added
// capabilities. A privileged container sees every device node on the node whatever
// the runtime does, and the toolkit counts CAP_SYS_ADMIN as privileged, honouring
// device requests from the environment even where the node refuses them from
// unprivileged containers. Default: warn (advisories.privileged); Pod Security
// Admission "baseline" is the companion that forbids both.
func checkPrivileged(ev *evaluation, c *containerRef) {
	sc := c.c.SecurityContext
	if sc == nil {
		return
	}
	eff := severityEffect(ev.e.policy.Spec.Advisories.Privileged)
	if sc.Privileged != nil && *sc.Privileged {
		ev.report(RulePrivileged, eff, c, c.path().Child("securityContext", "privileged").String(),
			"container %q is privileged and sees every GPU; use Pod Security baseline", c.c.Name)
		return
	}
	if sc.Capabilities == nil {
		return
	}
	for i, capability := range sc.Capabilities.Add {
		if grantsDevices(capability) {
			ev.report(RulePrivileged, eff, c, c.path().Child("securityContext", "capabilities", "add").Index(i).String(),
				"container %q adds %s, which the NVIDIA runtime treats as privileged", c.c.Name, capability)
			return
		}
	}
}

func grantsDevices(c corev1.Capability) bool {
	name := strings.TrimPrefix(strings.ToUpper(string(c)), "CAP_")
	return name == "SYS_ADMIN" || name == "ALL"
}
