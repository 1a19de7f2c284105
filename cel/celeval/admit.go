package celeval

import (
	"context"
	"fmt"
	"maps"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/generic"
	"k8s.io/apiserver/pkg/admission/plugin/policy/mutating"
	"k8s.io/apiserver/pkg/admission/plugin/policy/mutating/patch"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"

	"github.com/gpuguard/gpuguard/cel/celcost"
)

// Request is one admission request as the API server sees it.
type Request struct {
	// Operation is CREATE or UPDATE.
	Operation       admission.Operation
	SubResource     string
	Namespace       string
	NamespaceLabels map[string]string
	Username        string
	// Object and OldObject are typed objects (a Pod, a Binding, a Deployment…).
	Object, OldObject runtime.Object
	// SkipMutation runs the validating policy alone, as if the mutating one
	// had not run.
	SkipMutation bool
}

// Result is what the backstop made of a request.
type Result struct {
	// Object is the object after the MutatingAdmissionPolicy.
	Object  runtime.Object
	Mutated bool
	// Denials, Warnings and Audited are the messages of failed validations,
	// by the validating binding's action.
	Denials, Warnings, Audited []string
}

// Admit runs a request through the MutatingAdmissionPolicy, then the
// ValidatingAdmissionPolicy on the mutated object, as the API server does.
func (e *Evaluator) Admit(ctx context.Context, r Request) (Result, error) {
	ns, err := e.namespace(ctx, r.Namespace, r.NamespaceLabels)
	if err != nil {
		return Result{}, err
	}
	res := Result{Object: r.Object}
	attr, err := attributes(r, r.Object)
	if err != nil {
		return Result{}, err
	}
	if !r.SkipMutation {
		if res.Object, res.Mutated, err = e.mutate(ctx, attr, ns); err != nil {
			return Result{}, fmt.Errorf("MutatingAdmissionPolicy: %w", err)
		}
	}
	if attr, err = attributes(r, res.Object); err != nil {
		return Result{}, err
	}
	return res, e.validate(ctx, attr, ns, &res)
}

// attributes are the admission attributes of a request for obj.
func attributes(r Request, obj runtime.Object) (admission.Attributes, error) {
	return celcost.Attributes(celcost.Request{Operation: r.Operation, SubResource: r.SubResource, Namespace: r.Namespace,
		Username: r.Username, Object: obj, OldObject: r.OldObject})
}

// namespace makes the request's namespace known to the matcher, with its
// labels and the one the API server sets.
func (e *Evaluator) namespace(ctx context.Context, name string, labels map[string]string) (*corev1.Namespace, error) {
	if name == "" {
		return nil, nil
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: maps.Clone(labels)}}
	if ns.Labels == nil {
		ns.Labels = map[string]string{}
	}
	ns.Labels["kubernetes.io/metadata.name"] = name
	if known, ok := e.namespaces[name]; ok && maps.Equal(known, ns.Labels) {
		return ns, nil // the fake client's writes are slow: write only what changed
	}
	e.namespaces[name] = ns.Labels
	namespaces := e.client.CoreV1().Namespaces()
	if _, err := namespaces.Update(ctx, ns, metav1.UpdateOptions{}); apierrors.IsNotFound(err) {
		_, err = namespaces.Create(ctx, ns, metav1.CreateOptions{})
		return ns, err
	} else if err != nil {
		return nil, err
	}
	return ns, nil
}

// matches says whether a policy and its binding both match the request.
func (e *Evaluator) matches(attr admission.Attributes, p generic.PolicyAccessor, b generic.BindingAccessor) (bool, schema.GroupVersionResource, schema.GroupVersionKind, error) {
	ok, gvr, gvk, err := e.matcher.DefinitionMatches(attr, e.objects, p)
	if !ok || err != nil {
		return false, gvr, gvk, err
	}
	ok, err = e.matcher.BindingMatches(attr, e.objects, b)
	return ok, gvr, gvk, err
}

func (e *Evaluator) mutate(ctx context.Context, attr admission.Attributes, ns *corev1.Namespace) (runtime.Object, bool, error) {
	obj := attr.GetObject()
	ok, gvr, gvk, err := e.matches(attr, mutating.NewMutatingAdmissionPolicyAccessor(e.policies.Mutating),
		mutating.NewMutatingAdmissionPolicyBindingAccessor(e.policies.MutatingBinding))
	if !ok || err != nil {
		return obj, false, err
	}
	va, err := admission.NewVersionedAttributes(attr, gvk, e.objects)
	if err != nil {
		return nil, false, err
	}
	if m := e.mutator.Matcher; m != nil {
		if mr := m.Match(ctx, va, nil, nil); mr.Error != nil || !mr.Matches {
			return obj, false, mr.Error
		}
	}
	for _, p := range e.mutator.Mutators {
		next, err := p.Patch(ctx, patch.Request{MatchedResource: gvr, VersionedAttributes: va, ObjectInterfaces: e.objects,
			OptionalVariables: plugincel.OptionalVariableBindings{}, Namespace: ns}, celcost.EvaluationBudget)
		if err != nil {
			return nil, false, err
		}
		if next, err = e.objects.GetObjectConvertor().ConvertToVersion(next, gvk.GroupVersion()); err != nil {
			return nil, false, err
		}
		va.UpdateObject(next)
	}
	return va.VersionedObject.Object(), len(e.mutator.Mutators) > 0, nil
}

func (e *Evaluator) validate(ctx context.Context, attr admission.Attributes, ns *corev1.Namespace, res *Result) error {
	ok, gvr, gvk, err := e.matches(attr, validating.NewValidatingAdmissionPolicyAccessor(e.policies.Validating),
		validating.NewValidatingAdmissionPolicyBindingAccessor(e.policies.ValidatingBinding))
	if !ok || err != nil {
		return err
	}
	va, err := admission.NewVersionedAttributes(attr, gvk, e.objects)
	if err != nil {
		return err
	}
	for _, d := range e.validator.Validate(ctx, gvr, va, nil, ns, celcost.EvaluationBudget, nil).Decisions {
		if d.Action != validating.ActionDeny {
			continue
		}
		for _, action := range e.policies.ValidatingBinding.Spec.ValidationActions {
			switch action {
			case "Deny":
				res.Denials = append(res.Denials, d.Message)
			case "Warn":
				res.Warnings = append(res.Warnings, d.Message)
			case "Audit":
				res.Audited = append(res.Audited, d.Message)
			}
		}
	}
	return nil
}
