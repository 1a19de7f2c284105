// Package celcost measures what gpuguard's admission CEL costs the API
// server: the runtime cost that the API server's own CEL library counts for
// each budgeted evaluation (k8s.io/apiserver's admission CEL compiler and
// evaluator), against the budget the API server allows it.
//
// The API server computes no static cost estimate for admission policies,
// as it does for CRD validation rules: `object` is untyped there, so no list
// has a known bound. What it enforces is this runtime count, per request:
// match conditions share one budget per configuration, a
// ValidatingAdmissionPolicy's validations and message expressions share
// another, and each mutation of a MutatingAdmissionPolicy has its own. A
// request over a budget fails the configuration; gpuguard's fail closed, so
// the pod is refused. The package imports only the CEL compiler, not the
// admission plugins, so that the static gpuguard binary can report costs.
package celcost

import (
	"context"
	"fmt"
	"slices"

	celgo "github.com/google/cel-go/cel"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/predicates/rules"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/cel/environment"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	"github.com/gpuguard/gpuguard/cel"
)

// The API server's budgets (k8s.io/apiserver/pkg/apis/cel).
const (
	// MatchConditionBudget is shared by one configuration's match conditions
	// on one request.
	MatchConditionBudget = celconfig.RuntimeCELCostBudgetMatchConditions
	// EvaluationBudget is shared by a ValidatingAdmissionPolicy's validations
	// and message expressions on one request, and given to each mutation.
	EvaluationBudget = celconfig.RuntimeCELCostBudget
	// ExpressionLimit bounds each expression's evaluation, a variable's
	// included, within those budgets.
	ExpressionLimit = celconfig.PerCallLimit
)

// Cost is what one budgeted part of a configuration cost on one object.
type Cost struct {
	// Part names the kind of configuration and the part of it, such as
	// "ValidatingAdmissionPolicy, match conditions".
	Part   string
	Cost   int64
	Budget int64
	// Err is why the part failed: out of its budget, or over the limit
	// of one expression (PerCallLimit), or an expression that fails.
	Err error
}

// Meter holds gpuguard's configurations, compiled as the API server
// compiles them.
type Meter struct {
	parts   []part
	objects admission.ObjectInterfaces
}

type part struct {
	name   string
	budget int64
	// scope is the configuration's match constraints; nil matches all.
	scope *admissionregistrationv1.MatchResources
	// eval returns the budget left after evaluating the part.
	eval func(ctx context.Context, in input, budget int64) (int64, error)
	// onWhatIsLeft: the part runs on what the part before it left of the
	// budget they share, as message expressions run after the validations.
	onWhatIsLeft bool
}

// input is one request, as every evaluator takes it.
type input struct {
	attr      *admission.VersionedAttributes
	request   *admissionv1.AdmissionRequest
	namespace *corev1.Namespace
}

// New compiles the backstop's policies and, when prefilter is not empty,
// the webhooks' pre-filter match condition.
func New(p *cel.Policies, prefilter string) (*Meter, error) {
	if p == nil || p.Validating == nil || p.Mutating == nil {
		return nil, fmt.Errorf("celcost: the policies lack a ValidatingAdmissionPolicy or a MutatingAdmissionPolicy")
	}
	m := &Meter{objects: admission.NewObjectInterfacesFromScheme(clientgoscheme.Scheme)}
	vap, err := validatingParts(p.Validating)
	if err != nil {
		return nil, fmt.Errorf("ValidatingAdmissionPolicy %s: %w", p.Validating.Name, err)
	}
	mapParts, err := mutatingParts(p.Mutating)
	if err != nil {
		return nil, fmt.Errorf("MutatingAdmissionPolicy %s: %w", p.Mutating.Name, err)
	}
	m.parts = append(append(m.parts, mapParts...), vap...)
	if prefilter != "" {
		compiler, err := NewCompiler(nil)
		if err != nil {
			return nil, err
		}
		cond, err := compileConditions(compiler, []plugincel.ExpressionAccessor{&expression{text: prefilter}})
		if err != nil {
			return nil, fmt.Errorf("pre-filter: %w", err)
		}
		m.parts = append(m.parts, part{name: "webhook pre-filter (match condition of each webhook)", budget: MatchConditionBudget, eval: conditionCost(cond, true)})
	}
	return m, nil
}

// Request is one admission request as the API server sees it.
type Request struct {
	// Operation is CREATE when empty.
	Operation         admission.Operation
	SubResource       string
	Namespace         string
	Username          string
	Object, OldObject runtime.Object
}

// Measure evaluates every part whose configuration's rules match the
// request, whatever the other parts decide (a validation is measured even
// where the match conditions would skip it): the cost of each part when it
// runs. A part that fails has its Err set; the error returned is about
// the request itself.
func (m *Meter) Measure(ctx context.Context, r Request) ([]Cost, error) {
	in, err := m.input(r)
	if err != nil {
		return nil, err
	}
	out := make([]Cost, 0, len(m.parts))
	var left int64
	for _, p := range m.parts {
		if !inScope(p.scope, in.attr) {
			continue
		}
		c, budget := Cost{Part: p.name, Budget: p.budget}, p.budget
		if p.onWhatIsLeft {
			budget = left
		}
		var err error
		if left, err = p.eval(ctx, in, budget); err != nil {
			c.Err, left = err, 0
		} else {
			c.Cost = budget - left
		}
		out = append(out, c)
	}
	return out, nil
}

// input is a request as the API server hands it to admission CEL.
func (m *Meter) input(r Request) (input, error) {
	attr, err := Attributes(r)
	if err != nil {
		return input{}, err
	}
	va, err := admission.NewVersionedAttributes(attr, attr.GetKind(), m.objects)
	if err != nil {
		return input{}, err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: r.Namespace, Labels: map[string]string{"kubernetes.io/metadata.name": r.Namespace}}}
	return input{attr: va, request: plugincel.CreateAdmissionRequest(attr, metav1.GroupVersionResource(attr.GetResource()), metav1.GroupVersionKind(attr.GetKind())),
		namespace: plugincel.CreateNamespaceObject(ns)}, nil
}

// Attributes are the admission attributes of a request: its kind from the
// object's type, its resource guessed from the kind (pods for a pod's
// subresources, such as a Binding's).
func Attributes(r Request) (admission.Attributes, error) {
	kinds, _, err := clientgoscheme.Scheme.ObjectKinds(r.Object)
	if err != nil {
		return nil, err
	}
	gvk := kinds[0]
	resource, _ := meta.UnsafeGuessKindToResource(gvk)
	if r.SubResource != "" {
		resource = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	}
	name := ""
	if a, err := meta.Accessor(r.Object); err == nil {
		name = a.GetName()
	}
	op := r.Operation
	var opts runtime.Object = &metav1.CreateOptions{}
	switch op {
	case "":
		op = admission.Create
	case admission.Update:
		opts = &metav1.UpdateOptions{}
	}
	return admission.NewAttributesRecord(r.Object, r.OldObject, gvk, r.Namespace, name, resource, r.SubResource, op,
		opts, false, &user.DefaultInfo{Name: r.Username}), nil
}

// validatingParts are a ValidatingAdmissionPolicy's budgeted parts: its
// match conditions, and its validations with their message expressions,
// which the API server evaluates on every request that reaches the
// validations, failed or not, on the budget the validations leave.
func validatingParts(p *admissionregistrationv1.ValidatingAdmissionPolicy) ([]part, error) {
	compiler, match, err := compileMatching(p.Spec.Variables, p.Spec.MatchConditions)
	if err != nil {
		return nil, err
	}
	var validations, messages []plugincel.ExpressionAccessor
	for _, v := range p.Spec.Validations {
		validations = append(validations, &expression{text: v.Expression})
		if v.MessageExpression != "" {
			messages = append(messages, &expression{text: v.MessageExpression, returns: celgo.StringType})
		}
	}
	checks, err := compileConditions(compiler, validations)
	if err != nil {
		return nil, fmt.Errorf("validations: %w", err)
	}
	msgs, err := compileConditions(compiler, messages)
	if err != nil {
		return nil, fmt.Errorf("message expressions: %w", err)
	}
	kind, scope := "ValidatingAdmissionPolicy", p.Spec.MatchConstraints
	return []part{
		{name: kind + ", match conditions", budget: MatchConditionBudget, scope: scope, eval: conditionCost(match, true)},
		{name: kind + ", validations", budget: EvaluationBudget, scope: scope, eval: conditionCost(checks, true)},
		// A message that fails is only logged by the API server (the
		// static message stands in), so its failure is no error here; its
		// cost counts.
		{name: kind + ", message expressions", budget: EvaluationBudget, scope: scope, eval: conditionCost(msgs, false), onWhatIsLeft: true},
	}, nil
}

// mutatingParts are a MutatingAdmissionPolicy's budgeted parts: its match
// conditions and each JSON Patch mutation.
func mutatingParts(p *admissionregistrationv1.MutatingAdmissionPolicy) ([]part, error) {
	compiler, match, err := compileMatching(p.Spec.Variables, p.Spec.MatchConditions)
	if err != nil {
		return nil, err
	}
	kind, scope := "MutatingAdmissionPolicy", p.Spec.MatchConstraints
	parts := []part{{name: kind + ", match conditions", budget: MatchConditionBudget, scope: scope, eval: conditionCost(match, true)}}
	opts := declarations
	opts.HasPatchTypes = true
	for i, mu := range p.Spec.Mutations {
		if mu.PatchType != admissionregistrationv1.PatchTypeJSONPatch || mu.JSONPatch == nil {
			return nil, fmt.Errorf("mutation %d is %s: only JSON Patch is measured", i, mu.PatchType)
		}
		ev := compiler.CompileMutatingEvaluator(&expression{text: mu.JSONPatch.Expression, returns: jsonPatchList}, opts, environment.StoredExpressions)
		if errs := ev.CompilationErrors(); len(errs) > 0 {
			return nil, fmt.Errorf("mutation %d: %w", i, errs[0])
		}
		parts = append(parts, part{name: fmt.Sprintf("%s, mutation %d", kind, i+1), budget: EvaluationBudget, scope: scope,
			eval: func(ctx context.Context, in input, budget int64) (int64, error) {
				res, left, err := ev.ForInput(ctx, in.attr, in.request, plugincel.OptionalVariableBindings{}, in.namespace, budget)
				if err == nil && res.Error != nil {
					err = res.Error
				}
				return left, err
			}})
	}
	return parts, nil
}

// inScope says whether a configuration's resource rules match a request.
func inScope(m *admissionregistrationv1.MatchResources, attr admission.Attributes) bool {
	if m == nil {
		return true
	}
	matches := func(named []admissionregistrationv1.NamedRuleWithOperations) bool {
		for _, r := range named {
			if len(r.ResourceNames) == 0 || slices.Contains(r.ResourceNames, attr.GetName()) {
				if (&rules.Matcher{Rule: r.RuleWithOperations, Attr: attr}).Matches() {
					return true
				}
			}
		}
		return false
	}
	return matches(m.ResourceRules) && !matches(m.ExcludeResourceRules)
}

// compileMatching is a policy's compiler, with its variables, and its match
// conditions compiled.
func compileMatching(vars []admissionregistrationv1.Variable, conds []admissionregistrationv1.MatchCondition) (*plugincel.CompositedCompiler, plugincel.ConditionEvaluator, error) {
	compiler, err := NewCompiler(vars)
	if err != nil {
		return nil, nil, err
	}
	match, err := compileConditions(compiler, matchConditions(conds))
	if err != nil {
		return nil, nil, fmt.Errorf("match conditions: %w", err)
	}
	return compiler, match, nil
}
