package policy

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gpuguard/gpuguard/policy/celexpr"
)

// checkInjectorAnnotations is the advisory rule injector-annotation: annotations
// that look like device requests to an injector the deny-list does not name.
//
// Fields read: the annotations device-annotation reads.
//
// Allowed values: any key that device-annotation denies (reported there), that
// starts with one of annotations.ignoredPrefixes (default cdi.kubevirt.io/), or
// whose domain has no label among annotations.suspectDomainLabels (default device,
// devices, cdi, mount, mounts, netdevice, netdevices). The domain is the part of
// the key before "/" (the whole key when it has none), split at "." and "-":
// injectors name their annotations so (devices.example.com/container.NAME), and a
// list of them can never be complete. Default: warn, so that an unknown injector
// is at least visible; deny its prefix in annotations.deniedPrefixes, or ignore it.
func checkInjectorAnnotations(in *Input) []Finding {
	a := &in.e.policy.Spec.Annotations
	if len(a.SuspectDomainLabels) == 0 {
		return nil
	}
	var out []Finding
	for _, key := range in.judgedAnnotations() {
		if in.e.deniedAnnotation(key) || slices.ContainsFunc(a.IgnoredPrefixes, func(p string) bool { return strings.HasPrefix(key, p) }) {
			continue
		}
		// KAI's gpu-fraction-num-devices is known, where the policy knows KAI.
		if in.e.policy.Spec.Integrations.KAIScheduler.Fractions && slices.Contains(kaiAnnotations, key) {
			continue
		}
		if suspect(key, a.SuspectDomainLabels) {
			out = append(out, podFinding(RuleInjectorAnnotation, effectWarn, in.t.metaPath.Child("annotations").Key(key).String(),
				"looks like an unlisted device injector's annotation; deny or ignore it in the policy"))
		}
	}
	return out
}

// suspect reports whether a label of a key's domain is one of labels.
func suspect(key string, labels []string) bool {
	domain, _, found := strings.Cut(key, "/")
	if !found {
		domain = key
	}
	for _, l := range strings.FieldsFunc(strings.ToLower(domain), func(r rune) bool { return r == '.' || r == '-' }) {
		if slices.Contains(labels, l) {
			return true
		}
	}
	return false
}

// RuleInjectorAnnotation is the rule of checkInjectorAnnotations.
const RuleInjectorAnnotation RuleID = "injector-annotation"

func init() {
	register(&Rule{
		ID:      RuleInjectorAnnotation,
		Summary: "advisory (warn): annotations that look like an unlisted injector's (`annotations.suspectDomainLabels`)",
		Order:   20, PodCheck: checkInjectorAnnotations, PodScopes: []scope{scopePod, scopeTemplate, scopeAddedAnnotations},
		// Any key whose domain holds a suspect label as a substring: the
		// rule's own test splits the domain into labels, which CEL does not.
		Trigger: func(in *CELInput) *CELTrigger {
			labels := in.Policy.Spec.Annotations.SuspectDomainLabels
			if len(labels) == 0 {
				return nil
			}
			// The key's domain is computed once per key (bound through a
			// one-element list, CEL having no let), and a label that
			// contains another is left out: the shorter one already
			// matches every domain it would.
			return &CELTrigger{Pod: fmt.Sprintf(`has(object.metadata.annotations) && object.metadata.annotations.exists(k, `+
				`[(k.contains("/") ? k.substring(0, k.indexOf("/")) : k).lowerAscii()].exists(d, %s.exists(l, d.contains(l))))`,
				celexpr.List(shortestLabels(labels)))}
		},
		Gap: "a warning only: the backstop renders what denies",
	})
}

// shortestLabels are the labels that contain no other, lower-cased: a domain
// that contains any label contains one of these.
func shortestLabels(labels []string) []string {
	var out []string
	for _, l := range labels {
		l = strings.ToLower(l)
		covered := false
		for _, other := range labels {
			if o := strings.ToLower(other); o != l && strings.Contains(l, o) {
				covered = true
				break
			}
		}
		if !covered && !slices.Contains(out, l) {
			out = append(out, l)
		}
	}
	return out
}
