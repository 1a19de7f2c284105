package policy

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuguard/gpuguard/config"
)

func TestCheckNVIDIARuntimeClass(t *testing.T) {
	withClass := func(rc string, cs ...corev1.Container) *corev1.Pod {
		p := podOf(cs...)
		p.Spec.RuntimeClassName = &rc
		return p
	}
	msg := `"nvidia" without a GPU limit; remove it or request a GPU`
	runRuleTable(t, []ruleCase{
		{name: "other class", req: Request{Object: withClass("gvisor", ctr("a"))}},
		{name: "GPU container", req: Request{Object: withClass("nvidia", ctr("a"), gpuCtr("g"))}},
		{name: "no GPU container", req: Request{Object: withClass("nvidia", ctr("a"))},
			want: []found{{RuleNVIDIARuntimeClass, effectWarn, "", "spec.runtimeClassName", msg, editNone}}},
		{name: "denied by the policy", policy: func(s *config.PolicySpec) { s.Advisories.NVIDIARuntimeClass = config.SeverityDeny },
			req:  Request{Object: withClass("nvidia", ctr("a"))},
			want: []found{{RuleNVIDIARuntimeClass, effectDeny, "", "spec.runtimeClassName", msg, editNone}}},
	}, checkNVIDIARuntimeClass, nil)
}
