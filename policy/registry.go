package policy

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/gpuguard/gpuguard/config"
)

// Rule is one rule of the policy, declared once, in its check_<rule>.go file,
// with everything that describes it: the engine runs its check, the CEL
// backstop renders its CEL form, and the documentation lists its summary and
// its gap.
type Rule struct {
	ID RuleID
	// Summary says in one line what the rule judges and its default effect;
	// the rule table of docs/policy.md is generated from it.
	Summary string
	// Order places the rule among the others: findings, and the backstop's
	// validations, come in this order.
	Order int

	// Exactly one of PodCheck and ContainerCheck is set, except for rules
	// the engine reports itself (Check nil, such as namespace-mode).
	// PodCheck judges the object's metadata and pod-level spec, in the scopes
	// listed in PodScopes; ContainerCheck judges each container a request
	// puts up for judgement.
	// Each returns what it found (nil for nothing), and changes nothing:
	// the engine keeps the findings and makes the edits they ask for.
	PodCheck       func(in *Input) []Finding
	PodScopes      []scope
	ContainerCheck func(in *Input, c *containerRef) []Finding

	// CEL is the rule's form in the CEL backstop, nil where the policy makes
	// the rule one the backstop does not render (a warning, say). A rule
	// without a CEL form at all leaves it nil.
	CEL func(in *CELInput) *CELCheck
	// Gap says what of the rule CEL cannot express exactly and leaves to the
	// webhook; "" when the CEL form is exact.
	Gap string
	// Trigger is the rule's part of the pre-filter (cel.Prefilter): CEL that
	// holds for every request on which the rule may report anything, at any
	// severity, or change the object. It may hold more often, never less:
	// a request for which no rule's trigger holds reaches neither the
	// webhooks nor the backstop. nil from the function means this policy
	// leaves the rule nothing to do. A rule with a check must have one.
	Trigger func(in *CELInput) *CELTrigger
	// WaivedWith names the rule whose result this one judges: an exemption
	// that waives that rule waives this one too (final-state checks that
	// inject-void ran, and would deny what its waiver let through).
	WaivedWith RuleID
}

// CELInput is what a rule's CEL form is rendered from.
type CELInput struct {
	Policy *config.Policy
	// DeviceVars are NVIDIA_VISIBLE_DEVICES and the policy's extra device
	// variables; Protected every protected name, device variables included.
	DeviceVars, Protected []string
	// NoGPUContainer is an expression over the object: no container the
	// request judges has GPU resources.
	NoGPUContainer string
	// IsGPU is a predicate over a container c: it has GPU resources. Unlike
	// NoGPUContainer it reads no variables, so triggers may use it.
	IsGPU string
	// JudgedLists are CEL lists of the containers the request judges, one per
	// container kind: all of them on CREATE, the added ephemeral containers on
	// an UPDATE of pods/ephemeralcontainers.
	JudgedLists []string
}

// CELTrigger is a rule's trigger: a predicate over any container c of the
// pod, whatever its kind (Container), over any env entry e of such a
// container (Env; it may read c too), or over the request (Pod). The
// pre-filter tests every rule's Env in one pass over each container's env.
type CELTrigger struct {
	Container, Env, Pod string
	// EnvNames are the names of the entries Env can hold for; nil means any.
	// Where every Env trigger lists them and they share a prefix, the
	// pre-filter tests that prefix first (most entries are not NVIDIA's).
	EnvNames []string
}

// CELCheck is a rule's validation in the CEL backstop. A container rule
// gives predicates over a container c, true where it breaks the rule: for
// containers without GPU resources (Plain), for GPU containers (GPU), or
// both; a pod rule gives a predicate over the object (Pod).
type CELCheck struct {
	Plain, GPU, Pod string
	// Message says what is wrong; for a container rule it follows
	// "container NAME ".
	Message string
}

var registry []*Rule

// register adds a rule; each check_<rule>.go file registers its rule from
// init. Registering an ID twice, or a rule without its documentation, is a
// programming error caught when the package loads.
func register(r *Rule) {
	if r.ID == "" || r.Summary == "" || r.Order == 0 {
		panic(fmt.Sprintf("policy: rule %q registered without its ID, summary or order", r.ID))
	}
	if r.PodCheck != nil && r.ContainerCheck != nil {
		panic(fmt.Sprintf("policy: rule %s has both a pod and a container check", r.ID))
	}
	if (r.PodCheck != nil || r.ContainerCheck != nil) && r.Trigger == nil {
		panic(fmt.Sprintf("policy: rule %s has a check but no trigger: the pre-filter would let its requests past", r.ID))
	}
	if slices.ContainsFunc(registry, func(o *Rule) bool { return o.ID == r.ID || o.Order == r.Order }) {
		panic(fmt.Sprintf("policy: rule %s registered twice, or its order %d taken", r.ID, r.Order))
	}
	registry = append(registry, r)
	slices.SortFunc(registry, func(a, b *Rule) int { return cmp.Compare(a.Order, b.Order) })
}

// Registry lists every rule, in order.
func Registry() []*Rule { return slices.Clone(registry) }

// runs says whether the pod-level rule judges a request of this scope.
func (r *Rule) runs(s scope) bool { return slices.Contains(r.PodScopes, s) }
