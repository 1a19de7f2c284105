package policy

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/policy/celexpr"
)

// checkCapabilities is the advisory rule capabilities.
//
// Fields read, in every container kind:
//   - securityContext.capabilities.add.
//
// Allowed values: no SYS_ADMIN or ALL (with or without CAP_) among the added
// capabilities. The NVIDIA Container Toolkit counts CAP_SYS_ADMIN in the bounding
// set as privileged and honours device requests from the environment of such a
// container even where the node refuses them from unprivileged ones, and grants
// those devices in its device cgroup: inject-void gives every such container
// without a GPU limit void, whatever injectVoid says.
// Nsight profiling and FUSE need SYS_ADMIN. Default: warn (advisories.capabilities).
//
// A privileged container is left to the rule privileged, unless that rule is only
// a warning and this one denies: then SYS_ADMIN denies it here, as it would
// without privileged.
func checkCapabilities(in *Input, c *containerRef) []Finding {
	sc := c.c.SecurityContext
	if sc == nil || sc.Capabilities == nil {
		return nil
	}
	advisories := in.e.policy.Spec.Advisories
	if sc.Privileged != nil && *sc.Privileged && !CapabilitiesJudgePrivileged(advisories.Privileged, advisories.Capabilities) {
		return nil
	}
	for i, capability := range sc.Capabilities.Add {
		if grantsDevices(capability) {
			return []Finding{containerFinding(RuleCapabilities, severityEffect(advisories.Capabilities), c,
				c.path().Child("securityContext", "capabilities", "add").Index(i).String(),
				"adds %s, which the NVIDIA runtime treats as privileged; drop it or exempt its service account", capability)}
		}
	}
	return nil
}

// devicesCapabilities are the capabilities that grant every device.
var devicesCapabilities = []string{"SYS_ADMIN", "ALL"}

// addsDevicesCapabilityCEL is grantsDevices for any added capability of a
// container c with a securityContext.
var addsDevicesCapabilityCEL = `has(c.securityContext.capabilities) && has(c.securityContext.capabilities.add) && ` +
	`c.securityContext.capabilities.add.exists(a, a.upperAscii() in ` + capabilitiesCEL(devicesCapabilities) + `)`

// toolkitPrivileged reports whether the NVIDIA Container Toolkit counts
// container c as privileged: privileged, or adding SYS_ADMIN or ALL
// (CAP_SYS_ADMIN in the bounding set). The toolkit honours the image's and
// the environment's device list for such a container even where the node
// refuses env device requests from unprivileged ones, and its CDI edits
// open those devices in the device cgroup.
func toolkitPrivileged(c *corev1.Container) bool {
	sc := c.SecurityContext
	if sc == nil {
		return false
	}
	return (sc.Privileged != nil && *sc.Privileged) || (sc.Capabilities != nil && slices.ContainsFunc(sc.Capabilities.Add, grantsDevices))
}

func grantsDevices(c corev1.Capability) bool {
	return slices.Contains(devicesCapabilities, capabilityName(c))
}

// capabilityName is a capability as the runtime reads it: upper case,
// without CAP_.
func capabilityName(c corev1.Capability) string {
	return strings.TrimPrefix(strings.ToUpper(string(c)), "CAP_")
}

// capabilitiesCEL lists capability names as a CEL list of the forms a pod
// may write them in once upper-cased: with and without CAP_.
func capabilitiesCEL(names []string) string {
	var forms []string
	for _, n := range names {
		forms = append(forms, n, "CAP_"+n)
	}
	return celexpr.List(forms)
}

// CapabilitiesJudgePrivileged reports whether the rule capabilities judges
// privileged containers too: only where it is stricter than the rule
// privileged, so that one container is never reported twice for one cause.
func CapabilitiesJudgePrivileged(privileged, capabilities config.Severity) bool {
	return privileged != config.SeverityDeny && capabilities == config.SeverityDeny
}

// RuleCapabilities is the rule of checkCapabilities.
const RuleCapabilities RuleID = "capabilities"

func init() {
	register(&Rule{
		ID:      RuleCapabilities,
		Summary: "advisory: a container adding `SYS_ADMIN` or `ALL`, which the NVIDIA runtime treats as privileged (warn by default)",
		Order:   180, ContainerCheck: checkCapabilities,
		// Any severity, privileged or not.
		Trigger: func(in *CELInput) *CELTrigger {
			return &CELTrigger{Container: looksForGPUTrigger}
		},
		Gap: "warnings: rendered only when the policy's severity is `deny`",
		CEL: func(in *CELInput) *CELCheck {
			a := in.Policy.Spec.Advisories
			if a.Capabilities != config.SeverityDeny {
				return nil
			}
			// A privileged container is judged by privileged alone, as in the
			// engine, unless privileged only warns.
			notPrivileged := `!(has(c.securityContext.privileged) && c.securityContext.privileged) && `
			if CapabilitiesJudgePrivileged(a.Privileged, a.Capabilities) {
				notPrivileged = ""
			}
			pred := `has(c.securityContext) && ` + notPrivileged + addsDevicesCapabilityCEL
			return &CELCheck{Plain: pred, GPU: pred, Message: "adds SYS_ADMIN; the NVIDIA runtime treats it as privileged"}
		},
	})
}
