package policy

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestCheckCapabilityName(t *testing.T) {
	adds := func(caps ...corev1.Capability) *corev1.SecurityContext {
		return &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: caps}}
	}
	runRuleTable(t, []ruleCase{
		{name: "plain ASCII", req: Request{Object: podOf(withSC(ctr("a"), adds("SYS_TIME", "net_bind_service", "CAP_CHOWN")))}},
		{name: "long s", req: Request{Object: podOf(withSC(ctr("a"), adds("CHOWN", "ſys_admin", "ı")))},
			want: []found{{RuleCapabilityName, effectDeny, "a", "spec.containers[0].securityContext.capabilities.add[1]",
				`adds "ſys_admin", a capability name with characters outside ASCII letters, digits and _: the runtime folds its case with Unicode rules, ` +
					"the API server with ASCII ones, so the two would read different capabilities; write it in plain ASCII", editNone}}},
	}, nil, checkCapabilityName)
}
