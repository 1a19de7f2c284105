package policy

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuguard/gpuguard/config"
)

func TestCheckCapabilities(t *testing.T) {
	adds := func(privileged bool, caps ...corev1.Capability) *corev1.SecurityContext {
		return &corev1.SecurityContext{Privileged: ptr(privileged), Capabilities: &corev1.Capabilities{Add: caps}}
	}
	msg := func(c string) string {
		return "adds " + c + ", which the NVIDIA runtime treats as privileged; drop it or exempt its service account"
	}
	denyCapabilities := func(s *config.PolicySpec) { s.Advisories.Capabilities = config.SeverityDeny }
	runRuleTable(t, []ruleCase{
		{name: "no capabilities", req: Request{Object: podOf(ctr("a"))}},
		{name: "harmless", req: Request{Object: podOf(withSC(ctr("a"), adds(false, "NET_ADMIN")))}},
		{name: "first granting one only", req: Request{Object: podOf(withSC(ctr("a"), adds(false, "NET_ADMIN", "cap_sys_admin", "ALL")))},
			want: []found{{RuleCapabilities, effectWarn, "a", "spec.containers[0].securityContext.capabilities.add[1]", msg("cap_sys_admin"), editNone}}},
		{name: "privileged left to privileged", req: Request{Object: podOf(withSC(ctr("a"), adds(true, "SYS_ADMIN")))}},
		{name: "privileged judged where stricter", policy: func(s *config.PolicySpec) {
			denyCapabilities(s)
			s.Advisories.Privileged = config.SeverityWarn
		}, req: Request{Object: podOf(withSC(ctr("a"), adds(true, "ALL")))},
			want: []found{{RuleCapabilities, effectDeny, "a", "spec.containers[0].securityContext.capabilities.add[0]", msg("ALL"), editNone}}},
	}, nil, checkCapabilities)
}
