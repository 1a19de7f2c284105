package policy

import (
	"fmt"
	"github.com/gpuguard/gpuguard/policy/celexpr"
	"strings"
)

// checkEnvFromPrefix is the rule envfrom-prefix: prefixes that spell a protected name.
//
// Fields read, in every container kind:
//   - envFrom[*].prefix.
//
// Allowed values: "" (judged by envfrom-unprefixed) or a prefix that no device
// variable or protected variable starts with. With prefix NV, a ConfigMap key
// IDIA_VISIBLE_DEVICES becomes NVIDIA_VISIBLE_DEVICES. Default action: deny; strip
// mode does not remove envFrom entries, which carry other variables too.
func checkEnvFromPrefix(in *Input, c *containerRef) []Finding {
	var out []Finding
	for i, src := range c.c.EnvFrom {
		if src.Prefix == "" {
			continue
		}
		for _, name := range in.e.protectedNames {
			if strings.HasPrefix(name, src.Prefix) {
				out = append(out, containerFinding(RuleEnvFromPrefix, effectDeny, c, c.path().Child("envFrom").Index(i).Child("prefix").String(),
					"prefix %s can form %s; use one no NVIDIA variable starts with", quote(src.Prefix), name))
				break
			}
		}
	}
	return out
}

// RuleEnvFromPrefix is the rule of checkEnvFromPrefix.
const RuleEnvFromPrefix RuleID = "envfrom-prefix"

func init() {
	register(&Rule{
		ID:      RuleEnvFromPrefix,
		Summary: "an `envFrom` prefix that can spell a protected name (`NV`, `NVIDIA_`, …)",
		Order:   140, ContainerCheck: checkEnvFromPrefix,
		// The CEL form is exact.
		Trigger: func(in *CELInput) *CELTrigger {
			return &CELTrigger{Container: envFromPrefixCEL(in)}
		},
		CEL: func(in *CELInput) *CELCheck {
			pred := envFromPrefixCEL(in)
			return &CELCheck{Plain: pred, GPU: pred, Message: "takes envFrom with a prefix that can form a protected NVIDIA variable"}
		},
	})
}

func envFromPrefixCEL(in *CELInput) string {
	return fmt.Sprintf(`has(c.envFrom) && c.envFrom.exists(f, has(f.prefix) && f.prefix != "" && %s.exists(n, n.startsWith(f.prefix)))`, celexpr.List(in.Protected))
}
