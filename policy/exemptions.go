package policy

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/gpuguard/gpuguard/config"
)

// RuleSet is a set of rules, by ID.
type RuleSet map[RuleID]bool

// Sorted lists the set's rules in their order of ID.
func (s RuleSet) Sorted() []RuleID { return slices.Sorted(maps.Keys(s)) }

// Waivers are the policy's service account exemptions merged by pair: the
// rules each pair waives, nil for every rule.
type Waivers map[config.ServiceAccountRef]RuleSet

// NewWaivers merges a policy's service account exemptions. A rule an entry
// names must exist; naming a rule waives the rules that judge what it does
// too (Rule.WaivedWith): final-state checks inject-void's result.
func NewWaivers(s *config.PolicySpec) (Waivers, error) {
	w := Waivers{}
	var errs field.ErrorList
	for i, ex := range s.Exemptions.ServiceAccounts {
		ref := ex.Ref()
		set, seen := w[ref]
		if len(ex.Rules) == 0 || (seen && set == nil) {
			w[ref] = nil
			continue
		}
		if set == nil {
			set = RuleSet{}
			w[ref] = set
		}
		for j, name := range ex.Rules {
			r := ruleByID(RuleID(name))
			if r == nil {
				errs = append(errs, field.NotSupported(field.NewPath("spec", "exemptions", "serviceAccounts").Index(i).Child("rules").Index(j),
					name, waivableRules()))
				continue
			}
			set[r.ID] = true
		}
	}
	for _, set := range w {
		for _, r := range registry {
			if r.WaivedWith != "" && set != nil && set[r.WaivedWith] {
				set[r.ID] = true
			}
		}
	}
	if len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	return w, nil
}

// Of is what pair waives: every rule (nil, true), some (set, true) or none.
func (w Waivers) Of(ref config.ServiceAccountRef) (RuleSet, bool) {
	set, ok := w[ref]
	return set, ok
}

// Waiving lists, as namespace/name, the pairs that waive rule id: every
// rule, or id among others. all lists the pairs that waive every rule.
func (w Waivers) Waiving(id RuleID) (pairs []string) {
	for ref, set := range w {
		if set == nil || set[id] {
			pairs = append(pairs, ref.Namespace+"/"+ref.Name)
		}
	}
	slices.Sort(pairs)
	return pairs
}

// Whole lists, as namespace/name, the pairs that waive every rule.
func (w Waivers) Whole() (pairs []string) {
	for ref, set := range w {
		if set == nil {
			pairs = append(pairs, ref.Namespace+"/"+ref.Name)
		}
	}
	slices.Sort(pairs)
	return pairs
}

// Partial reports whether some pair waives only some rules.
func (w Waivers) Partial() bool {
	for _, set := range w {
		if set != nil {
			return true
		}
	}
	return false
}

func ruleByID(id RuleID) *Rule {
	if id == RuleNamespaceMode {
		return nil // the engine's note on a label, not a check to waive
	}
	for _, r := range registry {
		if r.ID == id {
			return r
		}
	}
	return nil
}

func waivableRules() []string {
	var ids []string
	for _, r := range registry {
		if ruleByID(r.ID) != nil {
			ids = append(ids, string(r.ID))
		}
	}
	return ids
}

// exemption names the policy exemption that covers a request, with the rules
// it waives (nil for every rule), or returns "". Pods are matched by
// namespace and the pod's own service account, never by labels or
// schedulerName, which users control; requests by the requesting user's
// name. What the requester writes (an ephemeral container, annotations added
// to a running pod, a binding's annotations) is not the pod's service
// account's doing, so a service account exemption does not cover it.
func (e *Engine) exemption(namespace, username string, byRequester bool, spec *corev1.PodSpec) (string, RuleSet) {
	if username != "" && e.exemptUsers[username] {
		return "user " + username, nil
	}
	if e.exemptNamespaces[namespace] {
		return "namespace " + namespace, nil
	}
	if byRequester {
		return "", nil
	}
	sa := serviceAccountOf(spec)
	if rules, ok := e.waivers.Of(config.ServiceAccountRef{Namespace: namespace, Name: sa}); ok {
		return "service account " + namespace + "/" + sa, rules
	}
	return "", nil
}

// describeWaiver says what a partial exemption let through, for the audit
// annotation.
func describeWaiver(by string, rules RuleSet) string {
	ids := make([]string, 0, len(rules))
	for _, id := range rules.Sorted() {
		ids = append(ids, string(id))
	}
	return fmt.Sprintf("%s waives %s", by, strings.Join(ids, ", "))
}

// serviceAccountOf is the service account a pod runs as, defaulted as the API
// server defaults it.
func serviceAccountOf(spec *corev1.PodSpec) string {
	switch {
	case spec.ServiceAccountName != "":
		return spec.ServiceAccountName
	case spec.DeprecatedServiceAccount != "":
		return spec.DeprecatedServiceAccount
	}
	return "default"
}
