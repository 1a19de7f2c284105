package celeval

import (
	"context"
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	"github.com/gpuguard/gpuguard/cel/celcost"
)

// Condition is one match condition, compiled as the API server compiles a
// webhook's or an admission policy's.
type Condition struct {
	name    string
	matcher matchconditions.Matcher
	objects admission.ObjectInterfaces
}

// NewCondition compiles a match condition.
func NewCondition(c admissionregistrationv1.MatchCondition) (*Condition, error) {
	compiler, err := celcost.NewCompiler(nil)
	if err != nil {
		return nil, err
	}
	fail := admissionregistrationv1.Fail
	opts := plugincel.OptionalVariableDeclarations{HasAuthorizer: true}
	return &Condition{name: c.Name, matcher: matchConditions(compiler, []admissionregistrationv1.MatchCondition{c}, &fail, c.Name, opts),
		objects: admission.NewObjectInterfacesFromScheme(clientgoscheme.Scheme)}, nil
}

// Holds evaluates the condition on a request. An expression that does not
// compile, or fails on this request, is an error.
func (c *Condition) Holds(ctx context.Context, r Request) (bool, error) {
	attr, err := attributes(r, r.Object)
	if err != nil {
		return false, err
	}
	va, err := admission.NewVersionedAttributes(attr, attr.GetKind(), c.objects)
	if err != nil {
		return false, err
	}
	res := c.matcher.Match(ctx, va, nil, nil)
	if res.Error != nil {
		return false, fmt.Errorf("match condition %s: %w", c.name, res.Error)
	}
	return res.Matches, nil
}
