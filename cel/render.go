package cel

import (
	"fmt"
	"slices"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/internal/wellknown"
	"github.com/gpuguard/gpuguard/policy"
	"github.com/gpuguard/gpuguard/policy/celexpr"
)

// DefaultName names the rendered policies and their bindings.
const DefaultName = "gpuguard-backstop"

// Options tune the rendering.
type Options struct {
	// Name of the policies and bindings (default DefaultName).
	Name string
	// ExcludedNamespaces are left out of the bindings, like the webhooks'
	// namespaceSelector: kube-system, kube-node-lease, gpuguard's own namespace
	// and add-ons that must run while gpuguard cannot.
	ExcludedNamespaces []string
	// KAIGuardOnly renders the KAI ConfigMap guard alone: a
	// ValidatingAdmissionPolicy, served from Kubernetes 1.30, for API
	// servers without MutatingAdmissionPolicy, where the rest of the
	// backstop cannot run but KAI's fractions still need their guard.
	KAIGuardOnly bool
}

// Policies are the rendered objects.
type Policies struct {
	Validating        *admissionregistrationv1.ValidatingAdmissionPolicy
	ValidatingBinding *admissionregistrationv1.ValidatingAdmissionPolicyBinding
	Mutating          *admissionregistrationv1.MutatingAdmissionPolicy
	MutatingBinding   *admissionregistrationv1.MutatingAdmissionPolicyBinding
	// KAIGuard and KAIGuardBinding keep tenants from writing the ConfigMaps
	// of KAI Scheduler's GPU fractions; nil unless the policy's KAI
	// integration is on (then the objects named KAIGuardName are stale).
	KAIGuard        *admissionregistrationv1.ValidatingAdmissionPolicy
	KAIGuardBinding *admissionregistrationv1.ValidatingAdmissionPolicyBinding
}

// Objects lists the rendered objects in the order to apply them.
func (p *Policies) Objects() []runtime.Object {
	var objs []runtime.Object
	if p.Validating != nil {
		objs = append(objs, p.Validating, p.ValidatingBinding, p.Mutating, p.MutatingBinding)
	}
	if p.KAIGuard != nil {
		objs = append(objs, p.KAIGuard, p.KAIGuardBinding)
	}
	return objs
}

// Render renders a policy as admission policies. It fails for a policy it cannot
// render faithfully (a gpuResources pattern with a character class).
func Render(p *config.Policy, o Options) (*Policies, error) {
	if o.Name == "" {
		o.Name = DefaultName
	}
	r, err := newRules(p)
	if err != nil {
		return nil, err
	}
	excluded := slices.Concat([]string{"kube-system", "kube-node-lease"}, o.ExcludedNamespaces, p.Spec.Exemptions.Namespaces)
	slices.Sort(excluded)
	match := &admissionregistrationv1.MatchResources{
		NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
			Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: slices.Compact(excluded)}}},
	}
	validatingMatch := match.DeepCopy()
	if relaxed := relaxingLabels(&p.Spec); len(relaxed) > 0 {
		// Where a namespace label relaxes the mode, the webhook alone judges: the
		// binding applies one mode, and must not deny what the webhook allows.
		validatingMatch.NamespaceSelector.MatchExpressions = append(validatingMatch.NamespaceSelector.MatchExpressions,
			metav1.LabelSelectorRequirement{Key: wellknown.ModeLabel, Operator: metav1.LabelSelectorOpNotIn, Values: relaxed})
	}
	out := &Policies{}
	if !o.KAIGuardOnly {
		out = &Policies{
			Validating:        r.validatingPolicy(o.Name),
			ValidatingBinding: validatingBinding(o.Name, p.Spec.Mode, validatingMatch),
			Mutating:          r.mutatingPolicy(o.Name),
			MutatingBinding:   mutatingBinding(o.Name, match),
		}
	}
	out.KAIGuard, out.KAIGuardBinding = kaiGuard(p, o.Name, match)
	return out, nil
}

// relaxingLabels lists the values of the namespace mode label that make the mode
// looser than the policy's own.
func relaxingLabels(spec *config.PolicySpec) []string {
	var relaxed []string
	for _, m := range config.Modes {
		if mode, _ := policy.ModeFor(spec, map[string]string{wellknown.ModeLabel: m}); mode.Strictness() < spec.Mode.Strictness() {
			relaxed = append(relaxed, m)
		}
	}
	return relaxed
}

var (
	failClosed = admissionregistrationv1.Fail
	equivalent = admissionregistrationv1.Equivalent
)

func podRules(ops ...[2]string) *admissionregistrationv1.MatchResources {
	var rules []admissionregistrationv1.NamedRuleWithOperations
	for _, op := range ops {
		rules = append(rules, admissionregistrationv1.NamedRuleWithOperations{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.OperationType(op[0])},
			Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{op[1]}},
		}})
	}
	return &admissionregistrationv1.MatchResources{ResourceRules: rules, MatchPolicy: &equivalent}
}

// exemptions are match conditions: a request they exclude is not judged. Pods are
// matched by namespace and the pod's own service account, never by labels. A
// service account exemption that names its rules waives those validations
// and mutations alone (waives).
func (r *rules) exemptions() []admissionregistrationv1.MatchCondition {
	ex := r.p.Spec.Exemptions
	var conds []admissionregistrationv1.MatchCondition
	if len(ex.Usernames) > 0 {
		conds = append(conds, admissionregistrationv1.MatchCondition{Name: "not-exempt-user",
			Expression: fmt.Sprintf("!(request.userInfo.username in %s)", celexpr.List(ex.Usernames))})
	}
	if whole := r.waivers.Whole(); len(whole) > 0 {
		conds = append(conds, admissionregistrationv1.MatchCondition{Name: "not-exempt-service-account",
			// What an UPDATE adds to a running pod (ephemeral containers,
			// annotations) is written by whoever sends it: not exempt.
			Expression: fmt.Sprintf(`request.operation == "UPDATE" || !(%s in %s)`, podServiceAccount, celexpr.List(whole))})
	}
	return conds
}

// podServiceAccount is the request's namespace/service account of the pod,
// defaulted as the API server defaults it.
const podServiceAccount = `(request.namespace + "/" + (has(object.spec.serviceAccountName) && object.spec.serviceAccountName != "" ? ` +
	`object.spec.serviceAccountName : (has(object.spec.serviceAccount) && object.spec.serviceAccount != "" ? object.spec.serviceAccount : "default")))`

// waives is true for a new pod whose service account exemption waives rule
// id; "" where none does. An UPDATE is the requester's doing: not exempt.
func (r *rules) waives(id policy.RuleID) string {
	pairs := r.waivers.Waiving(id)
	if len(pairs) == 0 || !r.waivers.Partial() {
		return ""
	}
	return fmt.Sprintf(`(request.operation == "CREATE" && %s in %s)`, podServiceAccount, celexpr.List(pairs))
}

// unlessWaived guards a validation's expression: it holds for a pod whose
// exemption waives the rule.
func (r *rules) unlessWaived(id policy.RuleID, expr string) string {
	if w := r.waives(id); w != "" {
		return w + " || " + expr
	}
	return expr
}

// check is one validation: a rule's CEL form.
type check struct {
	rule policy.RuleID
	policy.CELCheck
}

// checks are the CEL forms of the registered rules, in their order, that this
// policy has the backstop render.
func (r *rules) checks() []check {
	in := r.input()
	var checks []check
	for _, rule := range policy.Registry() {
		if rule.CEL == nil {
			continue
		}
		if c := rule.CEL(in); c != nil {
			checks = append(checks, check{rule: rule.ID, CELCheck: *c})
		}
	}
	return checks
}

// variables classify the judged containers once per request: every rule that
// depends on a container's GPUs reads these lists instead of testing its limits
// again.
func (r *rules) variables() []admissionregistrationv1.Variable {
	var vars []admissionregistrationv1.Variable
	for _, l := range containerLists {
		vars = append(vars,
			admissionregistrationv1.Variable{Name: l.variable("gpu"), Expression: fmt.Sprintf("%s.filter(c, %s)", l.judged(), r.gpu)},
			admissionregistrationv1.Variable{Name: l.variable("plain"), Expression: fmt.Sprintf("%s.filter(c, !(%s))", l.judged(), r.gpu)})
	}
	return vars
}

// containerValidation joins a check's predicates over every container kind into
// one validation. Its message is static: the API server evaluates every
// message expression of a policy on every request that reaches its
// validations, failed or not, so one naming the offending container would run
// the predicates a second time for every pod judged (cel/celcost
// measured it at as much again as the validations). The webhook, which judges
// first when it is up, names the container and the field.
func containerValidation(ch check) admissionregistrationv1.Validation {
	var violations []string
	for _, part := range []struct{ class, pred string }{{"plain", ch.Plain}, {"gpu", ch.GPU}} {
		if part.pred == "" {
			continue
		}
		for _, l := range containerLists {
			violations = append(violations, fmt.Sprintf("variables.%s.exists(c, %s)", l.variable(part.class), part.pred))
		}
	}
	return admissionregistrationv1.Validation{
		Expression: "!(" + strings.Join(violations, " || ") + ")",
		Message:    fmt.Sprintf("gpuguard backstop [%s]: a container %s", ch.rule, ch.Message),
		Reason:     ptr(metav1.StatusReasonForbidden),
	}
}

func (r *rules) validatingPolicy(name string) *admissionregistrationv1.ValidatingAdmissionPolicy {
	var validations []admissionregistrationv1.Validation
	for _, ch := range r.checks() {
		if ch.Pod == "" {
			v := containerValidation(ch)
			v.Expression = r.unlessWaived(ch.rule, v.Expression)
			validations = append(validations, v)
			continue
		}
		validations = append(validations, admissionregistrationv1.Validation{
			Expression: r.unlessWaived(ch.rule, "!("+ch.Pod+")"),
			Message:    fmt.Sprintf("gpuguard backstop [%s]: %s", ch.rule, ch.Message),
			Reason:     ptr(metav1.StatusReasonForbidden),
		})
	}
	return &admissionregistrationv1.ValidatingAdmissionPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingAdmissionPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &failClosed,
			MatchConstraints: podRules([2]string{"CREATE", "pods"}, [2]string{"UPDATE", "pods"}, [2]string{"UPDATE", "pods/ephemeralcontainers"},
				[2]string{"UPDATE", "pods/status"}),
			MatchConditions: append([]admissionregistrationv1.MatchCondition{{Name: "annotations-changed-on-status", Expression: AnnotationsChanged}},
				append(r.exemptions(), admissionregistrationv1.MatchCondition{Name: PrefilterName, Expression: r.hasWork})...),
			Variables:   r.variables(),
			Validations: validations,
		},
	}
}

var labels = wellknown.OwnedLabels(wellknown.ComponentCELBackstop)

func validatingBinding(name string, mode config.Mode, match *admissionregistrationv1.MatchResources) *admissionregistrationv1.ValidatingAdmissionPolicyBinding {
	action := map[config.Mode]admissionregistrationv1.ValidationAction{
		config.ModeEnforce: admissionregistrationv1.Deny, config.ModeWarn: admissionregistrationv1.Warn, config.ModeAudit: admissionregistrationv1.Audit,
	}[mode]
	return &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingAdmissionPolicyBinding"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName: name, ValidationActions: []admissionregistrationv1.ValidationAction{action}, MatchResources: match,
		},
	}
}

func ptr[T any](v T) *T { return &v }
