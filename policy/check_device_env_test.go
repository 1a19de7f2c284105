package policy

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestCheckDeviceEnv(t *testing.T) {
	nvd := func(v string) corev1.EnvVar { return envVar("NVIDIA_VISIBLE_DEVICES", v) }
	runRuleTable(t, []ruleCase{
		{name: "void and empty", req: Request{Object: podOf(ctr("a", nvd("void"), nvd("")), gpuCtr("g", nvd("void")))}},
		{name: "none on a GPU-free container in validation", req: Request{Object: podOf(ctr("a", nvd("none")))}},
		{name: "none rewritten when mutating", req: mutating(podOf(ctr("a", envVar("X", "1"), nvd("none")))),
			want: []found{{RuleDeviceEnv, effectNone, "a", "", "", editVoidValue}}},
		{name: "every entry counts", req: Request{Object: podOf(ctr("a", nvd("all"), nvd("void")), gpuCtr("g", nvd("none")))},
			want: []found{
				{RuleDeviceEnv, effectDeny, "a", "spec.containers[0].env[0]", `sets NVIDIA_VISIBLE_DEVICES="all" without a GPU limit; remove it or add a GPU limit`, editNone},
				{RuleDeviceEnv, effectDeny, "g", "spec.containers[1].env[0]", `sets NVIDIA_VISIBLE_DEVICES="none" over its GPU allocation; remove it`, editNone},
			}},
		{name: "valueFrom left to env-value-from", req: Request{Object: podOf(ctr("a", corev1.EnvVar{Name: "NVIDIA_VISIBLE_DEVICES",
			ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}))}},
	}, nil, checkDeviceEnv)
}

// TestEnvFindingsFold: a container with thousands of offending entries
// costs the rule MaxFindings+1 findings, the rest folded into the last as
// entry indexes; the engine still counts every one (bounds_test.go).
func TestEnvFindingsFold(t *testing.T) {
	const n = 5000
	env := make([]corev1.EnvVar, n)
	for i := range env {
		env[i] = corev1.EnvVar{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}
	}
	in := inputOf(t, nil, Request{Object: podOf(ctr("flood", env...))})
	got := checkDeviceEnv(in, &in.containers[0])
	if len(got) != MaxFindings+1 {
		t.Fatalf("%d findings, want %d", len(got), MaxFindings+1)
	}
	last := got[len(got)-1]
	if len(last.folded) != n-MaxFindings-1 || last.folded[0] != MaxFindings+1 || last.folded[len(last.folded)-1] != n-1 {
		t.Errorf("folded %d entries (%v…), want %d from %d", len(last.folded), last.folded[:min(3, len(last.folded))], n-MaxFindings-1, MaxFindings+1)
	}
}
