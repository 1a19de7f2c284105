package policy

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestCheckVoidHidesGPU(t *testing.T) {
	privileged := withSC(ctr("p"), &corev1.SecurityContext{Privileged: ptr(true)})
	sysAdmin := withSC(ctr("s"), &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"SYS_ADMIN"}}})
	msg := func(why string) string {
		return "will see no GPU: it is " + why + " but has no GPU limit, so gpuguard sets NVIDIA_VISIBLE_DEVICES=void; if it needs GPUs, request one or exempt its service account"
	}
	runRuleTable(t, []ruleCase{
		{name: "mutating phase", req: mutating(podOf(privileged))},
		{name: "GPU container", req: Request{Object: podOf(withSC(gpuCtr("g"), &corev1.SecurityContext{Privileged: ptr(true)}))}},
		{name: "privileged and SYS_ADMIN", req: Request{Object: podOf(ctr("a"), privileged, sysAdmin)},
			want: []found{
				{RuleVoidHidesGPU, effectWarn, "p", "spec.containers[1]", msg("privileged"), editNone},
				{RuleVoidHidesGPU, effectWarn, "s", "spec.containers[2]", msg("adds SYS_ADMIN"), editNone},
			}},
	}, nil, checkVoidHidesGPU)
}

// TestVoidHidesGPUQuietWhenDenied: a request an earlier finding denies
// gets no advice.
func TestVoidHidesGPUQuietWhenDenied(t *testing.T) {
	in := inputOf(t, nil, Request{Object: podOf(withSC(ctr("p"), &corev1.SecurityContext{Privileged: ptr(true)}))})
	in.sofar.kept[effectDeny] = 1
	if fs := checkVoidHidesGPU(in, &in.containers[0]); fs != nil {
		t.Errorf("advice on a denied request: %+v", foundOf(fs))
	}
}
