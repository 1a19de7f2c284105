package policy

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestCheckEnvFromPrefix(t *testing.T) {
	withEnvFrom := func(prefixes ...string) corev1.Container {
		c := ctr("a")
		for _, p := range prefixes {
			c.EnvFrom = append(c.EnvFrom, corev1.EnvFromSource{Prefix: p,
				ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}}})
		}
		return c
	}
	runRuleTable(t, []ruleCase{
		{name: "safe prefixes", req: Request{Object: podOf(withEnvFrom("APP_", "X"))}},
		{name: "NV", req: Request{Object: podOf(withEnvFrom("APP_", "NV"))},
			want: []found{{RuleEnvFromPrefix, effectDeny, "a", "spec.containers[0].envFrom[1].prefix",
				`prefix "NV" can form NVIDIA_VISIBLE_DEVICES; use one no NVIDIA variable starts with`, editNone}}},
	}, nil, checkEnvFromPrefix)
}
