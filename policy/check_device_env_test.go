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
