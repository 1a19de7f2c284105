package policy

import (
	"fmt"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/internal/wellknown"
)

func (e *Engine) modeFor(labels map[string]string) (config.Mode, string) {
	return ModeFor(&e.policy.Spec, labels)
}

// ModeFor returns the mode for a namespace with these labels, and a note when the
// label was ignored. The label may always tighten the policy's mode (audit, warn,
// enforce, in that order); it may relax it only when the policy allows Any.
func ModeFor(spec *config.PolicySpec, labels map[string]string) (config.Mode, string) {
	base := spec.Mode
	value, ok := labels[wellknown.ModeLabel]
	if !ok {
		return base, ""
	}
	m := config.Mode(value)
	switch {
	case m.Strictness() == 0:
		return base, fmt.Sprintf("%s is not enforce, warn or audit; mode %s applies", quote(value), base)
	case m.Strictness() > base.Strictness() || spec.NamespaceModeOverride == config.OverrideAny:
		return m, ""
	case m.Strictness() < base.Strictness():
		return base, fmt.Sprintf("%s may only tighten the policy; mode %s applies", quote(value), base)
	}
	return base, ""
}
