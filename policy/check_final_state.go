package policy

import (
	"github.com/gpuguard/gpuguard/policy/celexpr"
)

// checkFinalState is the rule final-state, in the validating phase of a pod.
//
// Fields read, in every container kind:
//   - resources.limits, to tell GPU containers;
//   - env[*], for the last entry of NVIDIA_VISIBLE_DEVICES and of each of the
//     policy's env.extraDeviceVariables.
//
// Allowed values, when the policy's injectVoid is on: in every container without GPU
// resources, an effective value of "void" or "". A container left without it means
// the mutating webhook did not run, timed out, or a later mutator removed the value;
// judging the final object is what makes the guarantee hold whatever happened in
// between. Default action: deny. Mirror pods, which gpuguard never mutates, get a
// warning instead.
func checkFinalState(in *Input, c *containerRef) []Finding {
	// A pod as it will be stored: the validating phase sees it after every
	// mutation.
	if !in.t.isPod || in.phase != Validating || c.gpu || !in.e.policy.Spec.InjectVoid {
		return nil
	}
	eff := effectDeny
	if isMirrorPod(in.t.meta) {
		eff = effectWarn
	}
	var out []Finding
	for _, name := range in.e.deviceVars {
		if !in.effectivelyVoid(c, name) {
			out = append(out, containerFinding(RuleFinalState, eff, c, c.path().Child("env").String(),
				"no GPU limit and no %s=void (gpuguard's mutation did not run); add it or retry", name))
		}
	}
	return out
}

// RuleFinalState is the rule of checkFinalState.
const RuleFinalState RuleID = "final-state"

func init() {
	register(&Rule{
		ID:      RuleFinalState,
		Summary: "(validating) a non-GPU container whose effective value is not `void`/`\"\"`",
		Order:   200, ContainerCheck: checkFinalState, WaivedWith: RuleInjectVoid,
		// A mirror pod's warning included: mirror pods are not told apart.
		Trigger: func(in *CELInput) *CELTrigger { return notVoidTrigger(in) },
		Gap:     "the warning for mirror pods (they are skipped)",
		CEL: func(in *CELInput) *CELCheck {
			if !in.Policy.Spec.InjectVoid {
				return nil
			}
			var missing []string
			for _, n := range in.DeviceVars {
				missing = append(missing, "!("+EffectivelyVoidCEL(in.Policy, n)+")")
			}
			return &CELCheck{Plain: "!" + celexpr.MirrorPod + " && (" + celexpr.Or(missing...) + ")",
				Message: "has no GPU limit and no NVIDIA_VISIBLE_DEVICES=void"}
		},
	})
}
