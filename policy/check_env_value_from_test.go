package policy

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestCheckEnvValueFrom(t *testing.T) {
	from := func(name string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}, Key: "k"}}}
	}
	runRuleTable(t, []ruleCase{
		{name: "unprotected name", req: Request{Object: podOf(ctr("a", from("LOG")))}},
		{name: "literal value", req: Request{Object: podOf(gpuCtr("g", envVar("NVIDIA_VISIBLE_DEVICES", "void")))}},
		{name: "device and protected variables", req: Request{Object: podOf(gpuCtr("g", from("NVIDIA_VISIBLE_DEVICES"), from("NVIDIA_GDS")))},
			want: []found{
				{RuleEnvValueFrom, effectDeny, "g", "spec.containers[0].env[0]", "sets NVIDIA_VISIBLE_DEVICES by valueFrom, unknown at admission; use a literal value or remove it", editNone},
				{RuleEnvValueFrom, effectDeny, "g", "spec.containers[0].env[1]", "sets NVIDIA_GDS by valueFrom, unknown at admission; use a literal value or remove it", editNone},
			}},
	}, nil, checkEnvValueFrom)
}
