package policy_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuguard/gpuguard/policy"
	"github.com/gpuguard/gpuguard/testsupport/fixtures"
)

// FuzzEvaluate feeds arbitrary pods, seeded from the fixtures, to the engine under
// the default policy and under strip mode, and checks three properties: it never
// panics; mutation is idempotent (the patched object needs no further patch); and
// every pod the mutating phase lets through passes the validating phase once patched.
func FuzzEvaluate(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "*", "*.yaml"))
	for _, path := range files {
		fx, _, req := loadFixture(f, path)
		if _, ok := req.Object.(*corev1.Pod); ok && fx.Operation == "" {
			data, err := json.Marshal(req.Object)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
		}
	}
	engines := map[string]*policy.Engine{}
	for name, overrides := range map[string]map[string]any{"default": nil, "strip": {"action": "strip"}} {
		e, err := (&fixtures.Fixture{Name: name, Policy: overrides}).Engine()
		if err != nil {
			f.Fatal(err)
		}
		engines[name] = e
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		pod := &corev1.Pod{}
		if err := json.Unmarshal(data, pod); err != nil {
			return
		}
		ctx := context.Background()
		for name, e := range engines {
			req := policy.Request{Operation: admissionv1.Create, Object: pod, Phase: policy.Mutating}
			mutated := e.Evaluate(ctx, &req)
			if !mutated.Allowed {
				continue
			}
			patched, err := policy.ApplyPatch(pod, mutated.Patch)
			if err != nil {
				t.Fatalf("%s: patch %+v does not apply: %v", name, mutated.Patch, err)
			}
			req.Object = patched
			if again := e.Evaluate(ctx, &req); len(again.Patch) != 0 {
				t.Fatalf("%s: mutation not idempotent: second patch %+v", name, again.Patch)
			}
			req.Phase = policy.Validating
			if final := e.Evaluate(ctx, &req); !final.Allowed {
				t.Fatalf("%s: mutating phase allowed the pod but validation denies it: %+v", name, final.Violations)
			}
		}
	})
}
