package policy

import (
	"slices"
)

// checkVoidHidesGPU is the warning rule void-hides-gpu: a container that looks
// like GPU infrastructure and that gpuguard's void will leave without a GPU.
//
// Fields read, in every container kind:
//   - resources.limits, to tell GPU containers;
//   - securityContext.privileged and securityContext.capabilities.add.
//
// Warns, whether or not the policy injects void everywhere, for a container without GPU resources
// that is privileged or adds SYS_ADMIN or ALL: such a container (a DCGM exporter, GPU Feature Discovery) is admitted, gets
// void (or has it already), and then sees no GPU, with no error anywhere. A pod
// controller is warned about when its template is judged, before any of its
// pods exists. Exempt pods are never judged, so never warned about;
// nor is a request already denied.
func checkVoidHidesGPU(in *Input, c *containerRef) []Finding {
	// Advice comes from the validating phase, after the injection: pods and
	// templates alike.
	if c.gpu || in.phase != Validating || (!in.t.isPod && in.scope != scopeTemplate) {
		return nil
	}
	sc := c.c.SecurityContext
	why := ""
	switch {
	case sc != nil && sc.Privileged != nil && *sc.Privileged:
		why = "privileged"
	case sc != nil && sc.Capabilities != nil && slices.ContainsFunc(sc.Capabilities.Add, grantsDevices):
		why = "adds SYS_ADMIN"
	default:
		return nil
	}
	// A request already denied needs no word about what its pods would see.
	if in.denied() {
		return nil
	}
	return []Finding{containerFinding(RuleVoidHidesGPU, effectWarn, c, c.path().String(),
		"will see no GPU: it is %s but has no GPU limit, so gpuguard sets NVIDIA_VISIBLE_DEVICES=void; if it needs GPUs, request one or exempt its service account", why)}
}

// RuleVoidHidesGPU is the rule of checkVoidHidesGPU.
const RuleVoidHidesGPU RuleID = "void-hides-gpu"

func init() {
	register(&Rule{
		ID: RuleVoidHidesGPU,
		Summary: "warning: a privileged or `SYS_ADMIN` container without a GPU limit, which void leaves without a GPU " +
			"(GPU infrastructure that needs an exemption)",
		Order: 195, ContainerCheck: checkVoidHidesGPU, WaivedWith: RuleInjectVoid,
		Trigger: func(in *CELInput) *CELTrigger {
			// Void reaches such a container whatever injectVoid says
			// (inject-void). Without the GPU test, which parses quantities: GPU
			// containers pass too, and the text is privileged's and
			// capabilities', which the pre-filter then tests once.
			return &CELTrigger{Container: looksForGPUTrigger}
		},
		Gap: "a warning only: the backstop renders what denies",
	})
}
