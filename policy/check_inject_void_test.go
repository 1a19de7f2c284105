package policy

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuguard/gpuguard/config"
)

func TestInjectVoid(t *testing.T) {
	privileged := withSC(ctr("p"), &corev1.SecurityContext{Privileged: ptr(true)})
	deployment := &appsv1.Deployment{Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{Spec: podOf(ctr("a"), gpuCtr("g"),
		ctr("v", envVar("NVIDIA_VISIBLE_DEVICES", "void"))).Spec}}}
	runRuleTable(t, []ruleCase{
		{name: "validating phase patches nothing", req: Request{Object: podOf(ctr("a"))}},
		{name: "appended where not void", req: mutating(podOf(ctr("a"), gpuCtr("g"), ctr("v", envVar("NVIDIA_VISIBLE_DEVICES", "")))),
			want: []found{{RuleInjectVoid, effectNone, "a", "", "", editAppendVoid}}},
		{name: "injection off: privileged only", policy: func(s *config.PolicySpec) { s.InjectVoid = false },
			req:  mutating(podOf(ctr("a"), privileged)),
			want: []found{{RuleInjectVoid, effectNone, "p", "", "", editAppendVoid}}},
		{name: "template: named, not patched", req: Request{Object: deployment},
			want: []found{{RuleInjectVoid, effectNone, "a", "", "", editTemplateVoid}}},
	}, nil, injectVoid)
}

// TestEffectivelyVoidSeesEarlierEdits: inject-void judges env as the
// edits planned by earlier rules leave it.
func TestEffectivelyVoidSeesEarlierEdits(t *testing.T) {
	in := inputOf(t, nil, mutating(podOf(ctr("a", envVar("NVIDIA_VISIBLE_DEVICES", "void"), envVar("NVIDIA_VISIBLE_DEVICES", "none")))))
	c := &in.containers[0]
	if in.effectivelyVoid(c, visibleDevices) {
		t.Fatal(`"none" counted as void`)
	}
	in.sofar.edits = map[int]*envEdits{0: {replace: map[int]string{1: voidValue}}}
	if !in.effectivelyVoid(c, visibleDevices) {
		t.Error("a planned rewrite to void not seen")
	}
	in.sofar.edits = map[int]*envEdits{0: {remove: map[int]bool{1: true}}}
	if !in.effectivelyVoid(c, visibleDevices) {
		t.Error("a planned removal not seen: the earlier void entry wins")
	}
}
