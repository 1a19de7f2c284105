package policy

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuguard/gpuguard/config"
)

func TestCheckPrivileged(t *testing.T) {
	privileged := &corev1.SecurityContext{Privileged: ptr(true)}
	msg := "sees every GPU of the node; drop it or exempt its service account"
	runRuleTable(t, []ruleCase{
		{name: "unset", req: Request{Object: podOf(ctr("a"))}},
		{name: "false", req: Request{Object: podOf(withSC(ctr("a"), &corev1.SecurityContext{Privileged: ptr(false)}))}},
		{name: "privileged GPU container", req: Request{Object: podOf(withSC(gpuCtr("a"), privileged))},
			want: []found{{RulePrivileged, effectDeny, "a", "spec.containers[0].securityContext.privileged", msg, editNone}}},
		{name: "advisory warns", policy: func(s *config.PolicySpec) { s.Advisories.Privileged = config.SeverityWarn },
			req:  Request{Object: podOf(ctr("a"), withSC(ctr("b"), privileged))},
			want: []found{{RulePrivileged, effectWarn, "b", "spec.containers[1].securityContext.privileged", msg, editNone}}},
	}, nil, checkPrivileged)
}
