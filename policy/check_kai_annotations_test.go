package policy

import (
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"

	"github.com/gpuguard/gpuguard/config"
)

func TestCheckKAIAnnotations(t *testing.T) {
	kai := func(s *config.PolicySpec) {
		s.Integrations.KAIScheduler.Fractions = true
		s.Integrations.KAIScheduler.BinderServiceAccounts = []string{"system:serviceaccount:kai:binder"}
	}
	before := withAnnotations(podOf(ctr("a")), map[string]string{KAIFractionAnnotation: "0.5"})
	after := withAnnotations(podOf(ctr("a")), map[string]string{KAIFractionAnnotation: "0.5", KAIDevicesAnnotation: "4"})
	update := Request{Operation: admissionv1.Update, Object: after, OldObject: before}
	byBinder := update
	byBinder.UserInfo = authenticationv1.UserInfo{Username: "system:serviceaccount:kai:binder"}
	runRuleTable(t, []ruleCase{
		{name: "integration off", req: update},
		{name: "unchanged", policy: kai, req: Request{Operation: admissionv1.Update, Object: before, OldObject: before}},
		{name: "binder", policy: kai, req: byBinder},
		{name: "raised", policy: kai, req: update,
			want: []found{{RuleKAIAnnotations, effectDeny, "", "metadata.annotations[gpu-fraction-num-devices]",
				"KAI Scheduler's fraction annotations are fixed once the pod exists; create a new pod instead", editNone}}},
	}, checkKAIAnnotations, nil)
}
