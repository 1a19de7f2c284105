package policy

import (
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
)

func TestCheckDeviceAnnotations(t *testing.T) {
	msg := "requests devices outside GPU accounting; remove it"
	old := withAnnotations(podOf(ctr("a")), map[string]string{"cdi.k8s.io/a": "x"})
	runRuleTable(t, []ruleCase{
		{name: "ordinary", req: Request{Object: withAnnotations(podOf(ctr("a")), map[string]string{"team": "x"})}},
		{name: "denied prefixes, sorted", req: Request{Object: withAnnotations(podOf(ctr("a")), map[string]string{"team": "x", "devices.gke.io/container.a": "y", "cdi.k8s.io/a": "z"})},
			want: []found{
				{RuleDeviceAnnotation, effectDeny, "", "metadata.annotations[cdi.k8s.io/a]", msg, editNone},
				{RuleDeviceAnnotation, effectDeny, "", "metadata.annotations[devices.gke.io/container.a]", msg, editNone},
			}},
		{name: "update keeping it", req: Request{Operation: admissionv1.Update, Object: old, OldObject: old}},
		{name: "update changing it", req: Request{Operation: admissionv1.Update, OldObject: old,
			Object: withAnnotations(podOf(ctr("a")), map[string]string{"cdi.k8s.io/a": "y"})},
			want: []found{{RuleDeviceAnnotation, effectDeny, "", "metadata.annotations[cdi.k8s.io/a]", msg, editNone}}},
	}, checkDeviceAnnotations, nil)
}
