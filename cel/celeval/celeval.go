// Package celeval evaluates gpuguard's rendered CEL backstop in-process, with
// the API server's own admission libraries (k8s.io/apiserver's policy
// matching, CEL compiler, validator and JSON Patch mutator), so that tests
// can hold it against the engine on every fixture in seconds. The end-to-end
// suite still proves the same on a real API server.
package celeval

import (
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/generic"
	"k8s.io/apiserver/pkg/admission/plugin/policy/matching"
	"k8s.io/apiserver/pkg/admission/plugin/policy/mutating"
	"k8s.io/apiserver/pkg/admission/plugin/policy/mutating/patch"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	"k8s.io/apiserver/pkg/cel/environment"
	"k8s.io/client-go/kubernetes/fake"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/gpuguard/gpuguard/cel"
	"github.com/gpuguard/gpuguard/cel/celcost"
)

// Evaluator holds one rendering of the backstop, compiled. It is not safe
// for concurrent use.
type Evaluator struct {
	policies  *cel.Policies
	validator validating.Validator
	mutator   mutating.PolicyEvaluator
	matcher   generic.PolicyMatcher
	client    *fake.Clientset
	objects   admission.ObjectInterfaces
	// namespaces are the labels of the namespaces written to client.
	namespaces map[string]map[string]string
}

// New compiles the rendered policies as the API server would.
func New(p *cel.Policies) (*Evaluator, error) {
	p = withDefaults(p)
	client := fake.NewClientset()
	// An empty lister: the matcher then reads namespaces from the client.
	namespaces := listersv1.NewNamespaceLister(cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{}))
	e := &Evaluator{
		policies:   p,
		validator:  compileValidating(p.Validating),
		mutator:    compileMutating(p.Mutating),
		matcher:    generic.NewPolicyMatcher(matching.NewMatcher(namespaces, client)),
		client:     client,
		objects:    admission.NewObjectInterfacesFromScheme(clientgoscheme.Scheme),
		namespaces: map[string]map[string]string{},
	}
	if err := e.validator.CompileError(); err != nil {
		return nil, fmt.Errorf("ValidatingAdmissionPolicy: %w", err)
	}
	if e.mutator.Error != nil {
		return nil, fmt.Errorf("MutatingAdmissionPolicy: %w", e.mutator.Error)
	}
	return e, nil
}

// withDefaults fills the selectors the API server defaults when it stores
// the policies and bindings.
func withDefaults(p *cel.Policies) *cel.Policies {
	out := &cel.Policies{Validating: p.Validating.DeepCopy(), ValidatingBinding: p.ValidatingBinding.DeepCopy(),
		Mutating: p.Mutating.DeepCopy(), MutatingBinding: p.MutatingBinding.DeepCopy()}
	for _, m := range []*admissionregistrationv1.MatchResources{out.Validating.Spec.MatchConstraints, out.ValidatingBinding.Spec.MatchResources,
		out.Mutating.Spec.MatchConstraints, out.MutatingBinding.Spec.MatchResources} {
		if m == nil {
			continue
		}
		if m.NamespaceSelector == nil {
			m.NamespaceSelector = &metav1.LabelSelector{}
		}
		if m.ObjectSelector == nil {
			m.ObjectSelector = &metav1.LabelSelector{}
		}
	}
	return out
}

func compileValidating(p *admissionregistrationv1.ValidatingAdmissionPolicy) validating.Validator {
	opts := plugincel.OptionalVariableDeclarations{HasAuthorizer: true}
	compiler, err := celcost.NewCompiler(p.Spec.Variables)
	if err != nil {
		return validating.NewValidator(nil, nil, nil, nil, p.Spec.FailurePolicy, err)
	}
	var validations, messages []plugincel.ExpressionAccessor
	for _, v := range p.Spec.Validations {
		validations = append(validations, &validating.ValidationCondition{Expression: v.Expression, Message: v.Message, Reason: v.Reason})
		if v.MessageExpression != "" {
			messages = append(messages, &validating.MessageExpressionCondition{MessageExpression: v.MessageExpression})
		} else {
			messages = append(messages, nil)
		}
	}
	return validating.NewValidator(
		compiler.CompileCondition(validations, opts, environment.StoredExpressions),
		matchConditions(compiler, p.Spec.MatchConditions, p.Spec.FailurePolicy, p.Name, opts),
		compiler.CompileCondition(nil, opts, environment.StoredExpressions),
		compiler.CompileCondition(messages, plugincel.OptionalVariableDeclarations{}, environment.StoredExpressions),
		p.Spec.FailurePolicy, nil)
}

func compileMutating(p *admissionregistrationv1.MutatingAdmissionPolicy) mutating.PolicyEvaluator {
	opts := plugincel.OptionalVariableDeclarations{HasAuthorizer: true}
	compiler, err := celcost.NewCompiler(p.Spec.Variables)
	if err != nil {
		return mutating.PolicyEvaluator{Error: err}
	}
	patchOpts := opts
	patchOpts.HasPatchTypes = true
	var patchers []patch.Patcher
	for _, m := range p.Spec.Mutations {
		if m.PatchType != admissionregistrationv1.PatchTypeJSONPatch || m.JSONPatch == nil {
			return mutating.PolicyEvaluator{Error: fmt.Errorf("mutation of type %s: only JSONPatch is evaluated here", m.PatchType)}
		}
		result := compiler.CompileMutatingEvaluator(&patch.JSONPatchCondition{Expression: m.JSONPatch.Expression}, patchOpts, environment.StoredExpressions)
		patchers = append(patchers, patch.NewJSONPatcher(result))
	}
	return mutating.PolicyEvaluator{Matcher: matchConditions(compiler, p.Spec.MatchConditions, p.Spec.FailurePolicy, p.Name, opts),
		Mutators: patchers, CompositedCompiler: compiler}
}

func matchConditions(compiler *plugincel.CompositedCompiler, conds []admissionregistrationv1.MatchCondition,
	fp *admissionregistrationv1.FailurePolicyType, name string, opts plugincel.OptionalVariableDeclarations) matchconditions.Matcher {
	if len(conds) == 0 {
		return nil
	}
	accessors := make([]plugincel.ExpressionAccessor, len(conds))
	for i := range conds {
		accessors[i] = (*matchconditions.MatchCondition)(&conds[i])
	}
	return matchconditions.NewMatcher(compiler.CompileCondition(accessors, opts, environment.StoredExpressions), fp, "policy", "validate", name)
}
