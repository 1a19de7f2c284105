package policy

import (
	"github.com/gpuguard/gpuguard/config"
)

// checkPrivileged is the rule privileged.
//
// Fields read, in every container kind:
//   - securityContext.privileged.
//
// Allowed values: unset or false. A privileged container sees every device node of
// the node, every GPU included, whatever it was allocated (kubernetes#81256): runc
// gives it the host's /dev and no device cgroup. A GPU container is no exception,
// and neither are sidecars or ephemeral containers (kubectl debug
// --profile=sysadmin). Default: deny (advisories.privileged); infrastructure that
// needs it (the GPU Operator, device plugins) is exempted by namespace and service
// account.
func checkPrivileged(in *Input, c *containerRef) []Finding {
	sc := c.c.SecurityContext
	if sc == nil || sc.Privileged == nil || !*sc.Privileged {
		return nil
	}
	return []Finding{containerFinding(RulePrivileged, severityEffect(in.e.policy.Spec.Advisories.Privileged), c,
		c.path().Child("securityContext", "privileged").String(),
		"sees every GPU of the node; drop it or exempt its service account")}
}

// looksForGPUTrigger is the trigger of every rule that judges a
// container's securityContext for what reaches the node's GPUs (privileged,
// capabilities, void-hides-gpu): privileged, or adding a capability that the
// NVIDIA runtime treats as privileged. One text for all three, wider than
// each alone needs, so that the pre-filter reads the securityContext once a
// container.
var looksForGPUTrigger = `has(c.securityContext) && ((has(c.securityContext.privileged) && c.securityContext.privileged) || (` +
	addsDevicesCapabilityCEL + `))`

// RulePrivileged is the rule of checkPrivileged.
const RulePrivileged RuleID = "privileged"

func init() {
	register(&Rule{
		ID:      RulePrivileged,
		Summary: "a privileged container (deny by default)",
		Order:   170, ContainerCheck: checkPrivileged,
		// Any severity.
		Trigger: func(in *CELInput) *CELTrigger { return &CELTrigger{Container: looksForGPUTrigger} },
		Gap:     "warnings: rendered only when the policy's severity is `deny` (the default)",
		CEL: func(in *CELInput) *CELCheck {
			if in.Policy.Spec.Advisories.Privileged != config.SeverityDeny {
				return nil
			}
			pred := `has(c.securityContext) && has(c.securityContext.privileged) && c.securityContext.privileged`
			return &CELCheck{Plain: pred, GPU: pred, Message: "is privileged and sees every GPU of the node"}
		},
	})
}
