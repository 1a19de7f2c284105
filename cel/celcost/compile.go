package celcost

import (
	"context"
	"errors"

	celgo "github.com/google/cel-go/cel"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/cel/environment"
)

// declarations are the optional variables the API server declares for
// gpuguard's policies, which take no parameters.
var declarations = plugincel.OptionalVariableDeclarations{HasAuthorizer: true}

// jsonPatchList is what a JSON Patch mutation returns.
var jsonPatchList = celgo.ListType(celgo.ObjectType("JSONPatch"))

// expression is one CEL expression and the type it must return (bool when
// unset).
type expression struct {
	text    string
	returns *celgo.Type
}

func (e *expression) GetExpression() string { return e.text }

func (e *expression) ReturnTypes() []*celgo.Type {
	if e.returns == nil {
		return []*celgo.Type{celgo.BoolType}
	}
	return []*celgo.Type{e.returns}
}

// namedExpression is a policy variable.
type namedExpression struct {
	expression
	name string
}

func (e *namedExpression) GetName() string { return e.name }

func (e *namedExpression) ReturnTypes() []*celgo.Type { return []*celgo.Type{celgo.AnyType} }

// NewCompiler is the API server's compiler for a policy with these
// variables (compiled with an authorizer, as it compiles gpuguard's, which
// take no parameters), at the environment it stores policies with.
func NewCompiler(vars []admissionregistrationv1.Variable) (*plugincel.CompositedCompiler, error) {
	compiler, err := plugincel.NewCompositedCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
	if err != nil {
		return nil, err
	}
	named := make([]plugincel.NamedExpressionAccessor, len(vars))
	for i, v := range vars {
		named[i] = &namedExpression{expression: expression{text: v.Expression}, name: v.Name}
	}
	compiler.CompileAndStoreVariables(named, declarations, environment.StoredExpressions)
	return compiler, nil
}

func matchConditions(conds []admissionregistrationv1.MatchCondition) []plugincel.ExpressionAccessor {
	out := make([]plugincel.ExpressionAccessor, len(conds))
	for i, c := range conds {
		out[i] = &expression{text: c.Expression}
	}
	return out
}

// compileConditions compiles expressions evaluated together, as match
// conditions, validations or messages are; a compilation error is an error.
func compileConditions(compiler *plugincel.CompositedCompiler, exprs []plugincel.ExpressionAccessor) (plugincel.ConditionEvaluator, error) {
	opts := declarations
	if len(exprs) > 0 && exprs[0].ReturnTypes()[0] == celgo.StringType {
		opts.HasAuthorizer = false // message expressions see no authorizer
	}
	ev := compiler.CompileCondition(exprs, opts, environment.StoredExpressions)
	return ev, errors.Join(ev.CompilationErrors()...)
}

// conditionCost evaluates expressions together on one budget and returns
// what is left of it. Running out of budget is an error, and so is an
// expression that fails when strict.
func conditionCost(ev plugincel.ConditionEvaluator, strict bool) func(context.Context, input, int64) (int64, error) {
	return func(ctx context.Context, in input, budget int64) (int64, error) {
		results, left, err := ev.ForInput(ctx, in.attr, in.request, plugincel.OptionalVariableBindings{}, in.namespace, budget)
		if err != nil {
			return 0, err
		}
		for _, r := range results {
			if strict && r.Error != nil {
				return 0, r.Error
			}
		}
		return left, nil
	}
}
