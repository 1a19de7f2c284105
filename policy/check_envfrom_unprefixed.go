package policy

import (
	"errors"
	"maps"
	"slices"

	"github.com/gpuguard/gpuguard/config"
)

// checkEnvFromUnprefixed is the rule envfrom-unprefixed: whole ConfigMaps and Secrets
// poured into a GPU container's environment.
//
// Fields read, in GPU containers and KAI fraction containers (in the others the
// injected void wins over envFrom; with injectVoid off, in every container),
// but a KAI fraction container's own -evar ConfigMap, which only KAI's binder
// may write:
//   - envFrom[*].prefix, envFrom[*].configMapRef.name, envFrom[*].secretRef.name;
//   - in inspect mode, the data of the referenced ConfigMap, each key judged as if it
//     were an env entry by device-env and protected-env.
//
// Treatment, from the policy's env.unprefixedEnvFromOnGPU:
//   - inspect (default): deny when the ConfigMap is known and holds a key those rules
//     forbid; warn when it is not known, and for Secrets, which gpuguard never reads;
//   - warn: warn on every such envFrom;
//   - deny: deny every such envFrom.
//
// A ConfigMap can change after admission: the node agent's volume-mounts or CDI
// allocation, which env cannot override, is the real fix.
func checkEnvFromUnprefixed(in *Input, c *containerRef) []Finding {
	gpu := in.gpuFeatures(c)
	if !gpu && in.e.policy.Spec.InjectVoid {
		return nil
	}
	treatment := in.e.policy.Spec.Env.UnprefixedEnvFromOnGPU
	kaiOwn := in.kaiEnvVarConfigMap(c)
	var out []Finding
	for i, src := range c.c.EnvFrom {
		if src.Prefix != "" || (kaiOwn != "" && src.ConfigMapRef != nil && src.ConfigMapRef.Name == kaiOwn) {
			continue
		}
		path := c.path().Child("envFrom").Index(i).String()
		switch {
		case treatment == config.EnvFromDeny:
			out = append(out, containerFinding(RuleEnvFromUnprefixed, effectDeny, c, path,
				"no prefix, so its keys could set NVIDIA variables; set a prefix"))
		case treatment == config.EnvFromWarn:
			out = append(out, containerFinding(RuleEnvFromUnprefixed, effectWarn, c, path,
				"no prefix; keep NVIDIA_ keys out of its source"))
		case src.SecretRef != nil:
			out = append(out, containerFinding(RuleEnvFromUnprefixed, effectWarn, c, path,
				"Secret %s is not checked; keep NVIDIA_ keys out of it", quote(src.SecretRef.Name)))
		case src.ConfigMapRef != nil:
			out = append(out, in.inspectConfigMap(c, gpu, path, src.ConfigMapRef.Name)...)
		}
	}
	return out
}

// inspectConfigMap judges the keys of a ConfigMap poured into container c,
// as a GPU container where gpu is set.
func (in *Input) inspectConfigMap(c *containerRef, gpu bool, path, name string) []Finding {
	var data map[string]string
	err := ErrConfigMapNotFound
	if in.req.ConfigMaps != nil {
		data, err = in.req.ConfigMaps.ConfigMapData(in.ctx, in.namespace, name)
	}
	switch {
	case errors.Is(err, ErrConfigMapNotFound):
		return []Finding{containerFinding(RuleEnvFromUnprefixed, effectWarn, c, path,
			"ConfigMap %s not found; create it first or set a prefix", quote(name))}
	case err != nil:
		return []Finding{containerFinding(RuleEnvFromUnprefixed, effectWarn, c, path,
			"ConfigMap %s could not be read (%v); set a prefix or retry", quote(name), err)}
	}
	var out []Finding
	for _, key := range slices.Sorted(maps.Keys(data)) {
		problem := in.e.protectedEnvProblem(gpu, key, data[key])
		if in.e.isDeviceVar(key) {
			problem = deviceEnvProblem(gpu, key, data[key])
		}
		if problem != "" {
			out = append(out, containerFinding(RuleEnvFromUnprefixed, effectDeny, c, path+".configMapRef",
				"through ConfigMap %s, %s", quote(name), problem))
		}
	}
	return out
}

// RuleEnvFromUnprefixed is the rule of checkEnvFromUnprefixed.
const RuleEnvFromUnprefixed RuleID = "envfrom-unprefixed"

func init() {
	register(&Rule{
		ID:      RuleEnvFromUnprefixed,
		Summary: "see `env.unprefixedEnvFromOnGPU`",
		Order:   150, ContainerCheck: checkEnvFromUnprefixed,
		// Whatever the treatment: deny, warn, or the webhook's inspection of
		// the ConfigMap (a warning), on the containers the rule judges.
		Trigger: func(in *CELInput) *CELTrigger {
			pred := `has(c.envFrom) && c.envFrom.exists(f, !has(f.prefix) || f.prefix == "")`
			if in.Policy.Spec.InjectVoid {
				pred += " && (" + in.IsGPU + " || " + KAIFractionCEL(in.Policy) + ")"
			}
			return &CELTrigger{Container: pred}
		},
		Gap: "inspecting a ConfigMap's keys needs to read it; CEL sees only the pod (rendered only when the policy denies every unprefixed " +
			"`envFrom` on GPU containers); KAI fraction containers are left to the webhook",
		CEL: func(in *CELInput) *CELCheck {
			if in.Policy.Spec.Env.UnprefixedEnvFromOnGPU != config.EnvFromDeny {
				return nil
			}
			return &CELCheck{GPU: `has(c.envFrom) && c.envFrom.exists(f, !has(f.prefix) || f.prefix == "")`, Message: "takes envFrom without a prefix; set a prefix"}
		},
	})
}
