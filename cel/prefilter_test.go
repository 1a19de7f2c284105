package cel_test

import (
	"context"
	"encoding/json"
	"regexp"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apiserver/pkg/admission"

	"github.com/gpuguard/gpuguard/cel"
	"github.com/gpuguard/gpuguard/cel/celeval"
	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/policy"
	"github.com/gpuguard/gpuguard/testsupport/fixtures"
)

// TestPrefilterIsSafe holds the pre-filter against the engine on every
// fixture, evaluated with the API server's own match-condition code: a pod
// the pre-filter lets past is one the engine admits with nothing to say and
// nothing to change but, at most, the void injection. Each pod is checked
// twice: as submitted (all the mutating webhook sees where no
// MutatingAdmissionPolicy runs; there even the void injection must pass
// the filter) and after the backstop's injection (what the webhooks and the
// ValidatingAdmissionPolicy see where it runs).
func TestPrefilterIsSafe(t *testing.T) {
	all, err := fixtures.All("../policy/testdata")
	if err != nil {
		t.Fatal(err)
	}
	checked, filtered := 0, 0
	for _, f := range all {
		req, err := f.Request()
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := req.Object.(*corev1.Pod); !ok {
			continue // other kinds always pass the filter
		}
		t.Run(f.Name, func(t *testing.T) {
			p, err := f.PolicyDocument()
			if err != nil {
				t.Fatal(err)
			}
			engine, err := policy.New(p)
			if err != nil {
				t.Fatal(err)
			}
			want, err := f.Evaluate(context.Background(), engine, req)
			if err != nil {
				t.Fatal(err)
			}
			checked++
			if !checkPrefilter(t, p, engine, req, want, f.Phase != policy.Validating) {
				filtered++
			}
		})
	}
	t.Logf("%d pod fixtures: %d kept from the webhooks and the backstop as submitted", checked, filtered)
	if filtered == 0 {
		t.Error("the pre-filter passes every fixture: it filters nothing")
	}
}

// checkPrefilter checks one request against the engine's result for it,
// and, when mutable, the request as the backstop's injection leaves it. It
// returns whether the pre-filter passes the request as submitted.
func checkPrefilter(t *testing.T, p *config.Policy, engine *policy.Engine, req policy.Request, want policy.Result, mutable bool) bool {
	t.Helper()
	ctx := context.Background()
	cond := prefilterFor(t, p)
	passes := holds(t, cond, req)
	if what := anything(want, false); what != "" && !passes {
		t.Errorf("the pre-filter keeps from the webhooks a pod the engine acts on: %s", what)
	}
	if !mutable {
		return passes
	}
	injected, err := evaluatorFor(t, p).Admit(ctx, celeval.Request{Operation: admission.Operation(req.Operation), SubResource: req.SubResource,
		Namespace: orDefault(req.Namespace), NamespaceLabels: req.NamespaceLabels, Username: req.UserInfo.Username,
		Object: req.Object.DeepCopyObject(), OldObject: req.OldObject})
	if err != nil || !injected.Mutated {
		return passes
	}
	after := req
	after.Object = injected.Object
	again, err := engine.Admit(ctx, after)
	if err != nil {
		t.Fatal(err)
	}
	if what := anything(again, true); what != "" && !holds(t, cond, after) {
		t.Errorf("after the backstop's injection, the pre-filter keeps from the webhooks a pod the engine acts on: %s", what)
	}
	return passes
}

// voidAdd is a patch operation of the void injection.
var voidAdd = regexp.MustCompile(`^/spec/(initContainers|containers|ephemeralContainers)/[0-9]+/env(/-)?$`)

// anything says what the engine does with a request beyond admitting it
// unchanged ("" for nothing): a denial, a warning, an audit annotation or a
// patch, where voidAllowed spares a patch that only appends device
// variables set to void. The namespace-mode warning is no finding about the
// pod: it tells that the namespace's label changed the mode, and a pod with
// nothing to judge loses nothing by not hearing it.
func anything(r policy.Result, voidAllowed bool) string {
	switch {
	case !r.Allowed || len(r.Violations) > 0:
		return "denied"
	case len(r.AuditAnnotations) > 0:
		return "audit annotations"
	}
	for _, w := range r.Warnings {
		if w.Rule != policy.RuleNamespaceMode {
			return "warning " + w.String()
		}
	}
	for _, op := range r.Patch {
		if !voidAllowed || op.Operation != "add" || !voidAdd.MatchString(op.Path) || !onlyVoid(op.Value) {
			raw, _ := json.Marshal(op)
			return "patch " + string(raw)
		}
	}
	return ""
}

// onlyVoid: a patch value of env entries (one, or a list) all set to void.
func onlyVoid(v any) bool {
	raw, err := json.Marshal(v)
	if err != nil {
		return false
	}
	var list []corev1.EnvVar
	if json.Unmarshal(raw, &list) != nil {
		var one corev1.EnvVar
		if json.Unmarshal(raw, &one) != nil {
			return false
		}
		list = []corev1.EnvVar{one}
	}
	for _, e := range list {
		if e.Value != "void" || e.ValueFrom != nil {
			return false
		}
	}
	return len(list) > 0
}

var prefilters = map[string]*celeval.Condition{}

func prefilterFor(t *testing.T, p *config.Policy) *celeval.Condition {
	t.Helper()
	expr, err := cel.Prefilter(p)
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := prefilters[expr]; ok {
		return c
	}
	c, err := celeval.NewCondition(admissionregistrationv1.MatchCondition{Name: cel.PrefilterName, Expression: expr})
	if err != nil {
		t.Fatal(err)
	}
	prefilters[expr] = c
	return c
}

func holds(t *testing.T, c *celeval.Condition, req policy.Request) bool {
	t.Helper()
	ok, err := c.Holds(context.Background(), celeval.Request{Operation: admission.Operation(req.Operation), SubResource: req.SubResource,
		Namespace: orDefault(req.Namespace), Username: req.UserInfo.Username, Object: req.Object, OldObject: req.OldObject})
	if err != nil {
		t.Fatalf("the pre-filter fails to evaluate: %v", err)
	}
	return ok
}

func orDefault(ns string) string {
	if ns == "" {
		return "default"
	}
	return ns
}
