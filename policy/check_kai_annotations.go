package policy

import (
	"fmt"
	"slices"

	"github.com/gpuguard/gpuguard/policy/celexpr"
)

// kaiAnnotations are the pod annotations that make a KAI Scheduler fraction
// and that gpuguard reads: admission at creation, the node verifier later.
var kaiAnnotations = []string{KAIFractionAnnotation, KAIMemoryAnnotation, KAIDevicesAnnotation, KAIContainerNameAnnotation, KAIConfigMapAnnotation}

// checkKAIAnnotations is the rule kai-annotations, with the policy's KAI
// integration on (spec.integrations.kaiScheduler.fractions).
//
// Fields read, on an UPDATE of a pod or of pods/status, and on a Binding:
//   - metadata.annotations gpu-fraction, gpu-memory, gpu-fraction-num-devices,
//     gpu-fraction-container-name and runai/shared-gpu-configmap, before and
//     after.
//
// Allowed values: unchanged, or changed by one of the policy's
// binderServiceAccounts. A pod's env is fixed at creation, so a changed
// fraction would not change what its container reads; but the node verifier
// accepts as many unallocated GPUs as the fraction spans, so raising
// gpu-fraction-num-devices later would hide a leak from it. Default action:
// deny, whatever the action.
func checkKAIAnnotations(in *Input) []Finding {
	k := &in.e.policy.Spec.Integrations.KAIScheduler
	if !k.Fractions || slices.Contains(k.BinderServiceAccounts, in.req.UserInfo.Username) {
		return nil
	}
	var out []Finding
	for _, key := range kaiAnnotations {
		now, inNow := in.t.meta.Annotations[key]
		before, inBefore := in.oldAnnotations[key]
		if inNow == inBefore && now == before {
			continue
		}
		out = append(out, podFinding(RuleKAIAnnotations, effectDeny, in.t.metaPath.Child("annotations").Key(key).String(),
			"KAI Scheduler's fraction annotations are fixed once the pod exists; create a new pod instead"))
	}
	return out
}

// RuleKAIAnnotations is the rule of checkKAIAnnotations.
const RuleKAIAnnotations RuleID = "kai-annotations"

func init() {
	register(&Rule{
		ID:      RuleKAIAnnotations,
		Summary: "with the KAI integration on, KAI Scheduler's fraction annotations added, changed or removed after creation, except by KAI's binder",
		Order:   15, PodCheck: checkKAIAnnotations, PodScopes: []scope{scopeAddedAnnotations},
		Trigger: func(in *CELInput) *CELTrigger {
			if !in.Policy.Spec.Integrations.KAIScheduler.Fractions {
				return nil
			}
			keys := celexpr.List(kaiAnnotations)
			return &CELTrigger{Pod: fmt.Sprintf(`(has(object.metadata.annotations) && %[1]s.exists(k, k in object.metadata.annotations)) || `+
				`(request.operation == "UPDATE" && has(oldObject.metadata.annotations) && %[1]s.exists(k, k in oldObject.metadata.annotations))`, keys)}
		},
		CEL: func(in *CELInput) *CELCheck {
			k := &in.Policy.Spec.Integrations.KAIScheduler
			if !k.Fractions {
				return nil
			}
			in1 := func(o string) string {
				return fmt.Sprintf("(has(%[1]s.metadata.annotations) && k in %[1]s.metadata.annotations)", o)
			}
			return &CELCheck{Message: "KAI Scheduler's fraction annotations are fixed once the pod exists",
				Pod: fmt.Sprintf(`request.operation == "UPDATE" && %s in ["", "status"] && !(request.userInfo.username in %s) && `+
					`%s.exists(k, %s != %s || (%[4]s && %[5]s && object.metadata.annotations[k] != oldObject.metadata.annotations[k]))`,
					celexpr.SubResource, celexpr.List(k.BinderServiceAccounts), celexpr.List(kaiAnnotations), in1("object"), in1("oldObject"))}
		},
	})
}
