package framework

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/gpuguard/gpuguard/policy"
)

// LastEnv is a variable's effective value in a stored container spec: of
// several entries the last one wins, as the kubelet builds the environment.
// "<unset>" when there is none.
func LastEnv(c corev1.Container, name string) string {
	if v, ok := policy.EffectiveEnv(&c, name); ok {
		return v.Value
	}
	return "<unset>"
}

// PinnedGroups shows what pin-parent-groups sets in a stored pod: its
// supplementalGroupsPolicy ("<unset>" without one), then NAME:GID for each
// init or regular container with a runAsGroup.
func PinnedGroups(p *corev1.Pod) string {
	out := "<unset>"
	if sc := p.Spec.SecurityContext; sc != nil && sc.SupplementalGroupsPolicy != nil {
		out = string(*sc.SupplementalGroupsPolicy)
	}
	for _, c := range append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...) {
		if c.SecurityContext != nil && c.SecurityContext.RunAsGroup != nil {
			out += fmt.Sprintf(" %s:%d", c.Name, *c.SecurityContext.RunAsGroup)
		}
	}
	return out
}

// deniedRule finds a rule name in a gpuguard denial's lines ("... [rule]: ...").
var deniedRule = regexp.MustCompile(`\[([a-z-]+)\]: `)

// DeniedRules returns the rules a gpuguard denial names, sorted, or an error
// when err is not a gpuguard denial.
func DeniedRules(err error) ([]string, error) {
	if err == nil {
		return nil, fmt.Errorf("admitted, want a gpuguard denial")
	}
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "gpuguard denied") {
		return nil, fmt.Errorf("want a gpuguard denial (403), got: %v", err)
	}
	var rules []string
	for _, m := range deniedRule.FindAllStringSubmatch(err.Error(), -1) {
		rules = append(rules, m[1])
	}
	slices.Sort(rules)
	return slices.Compact(rules), nil
}
