package policy

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuguard/gpuguard/config"
)

// configMaps serve ConfigMaps by name, whatever the namespace.
type configMaps map[string]map[string]string

func (cms configMaps) ConfigMapData(_ context.Context, _, name string) (map[string]string, error) {
	if d, ok := cms[name]; ok {
		return d, nil
	}
	return nil, ErrConfigMapNotFound
}

func TestCheckEnvFromUnprefixed(t *testing.T) {
	from := func(c corev1.Container, cm, secret string) corev1.Container {
		if cm != "" {
			c.EnvFrom = append(c.EnvFrom, corev1.EnvFromSource{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: cm}}})
		}
		if secret != "" {
			c.EnvFrom = append(c.EnvFrom, corev1.EnvFromSource{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: secret}}})
		}
		return c
	}
	cms := configMaps{"good": {"LOG": "1"}, "bad": {"NVIDIA_VISIBLE_DEVICES": "all", "LOG": "1"}}
	treat := func(tr config.EnvFromAction) func(*config.PolicySpec) {
		return func(s *config.PolicySpec) { s.Env.UnprefixedEnvFromOnGPU = tr }
	}
	runRuleTable(t, []ruleCase{
		{name: "container without GPUs gets void", req: Request{Object: podOf(from(ctr("a"), "bad", ""))}},
		{name: "inspected: fine", req: Request{ConfigMaps: cms, Object: podOf(from(gpuCtr("g"), "good", ""))}},
		{name: "inspected: a key that grants, a secret, a missing map", req: Request{ConfigMaps: cms, Object: podOf(from(from(gpuCtr("g"), "bad", "s"), "gone", ""))},
			want: []found{
				{RuleEnvFromUnprefixed, effectDeny, "g", "spec.containers[0].envFrom[0].configMapRef",
					`through ConfigMap "bad", sets NVIDIA_VISIBLE_DEVICES="all" over its GPU allocation; remove it`, editNone},
				{RuleEnvFromUnprefixed, effectWarn, "g", "spec.containers[0].envFrom[1]", `Secret "s" is not checked; keep NVIDIA_ keys out of it`, editNone},
				{RuleEnvFromUnprefixed, effectWarn, "g", "spec.containers[0].envFrom[2]", `ConfigMap "gone" not found; create it first or set a prefix`, editNone},
			}},
		{name: "deny", policy: treat(config.EnvFromDeny), req: Request{Object: podOf(from(gpuCtr("g"), "good", ""))},
			want: []found{{RuleEnvFromUnprefixed, effectDeny, "g", "spec.containers[0].envFrom[0]", "no prefix, so its keys could set NVIDIA variables; set a prefix", editNone}}},
		{name: "warn, every container without void", policy: func(s *config.PolicySpec) { treat(config.EnvFromWarn)(s); s.InjectVoid = false },
			req:  Request{Object: podOf(from(ctr("a"), "good", ""))},
			want: []found{{RuleEnvFromUnprefixed, effectWarn, "a", "spec.containers[0].envFrom[0]", "no prefix; keep NVIDIA_ keys out of its source", editNone}}},
	}, nil, checkEnvFromUnprefixed)
}
