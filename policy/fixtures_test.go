package policy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/internal/manifest"
	"github.com/gpuguard/gpuguard/policy"
)

var update = flag.Bool("update", false, "rewrite the golden files of testdata/{pass,fail}")

// fixture is one case in testdata/pass or testdata/fail. The hand-written
// expectations (expect, warn, audit, mutate, exempt) are asserted exactly; the golden
// file next to it records the whole result and is rewritten with -update.
type fixture struct {
	Description string `json:"description"`
	// Expect lists the rules of the violations that deny the object.
	Expect []policy.RuleID `json:"expect"`
	// Warn lists the rules of the warnings returned.
	Warn []policy.RuleID `json:"warn"`
	// Audit lists the audit annotation keys recorded.
	Audit []string `json:"audit"`
	// Mutate says whether the object gets a patch.
	Mutate bool `json:"mutate"`
	// Exempt says whether an exemption let the object through.
	Exempt bool `json:"exempt"`
	// Phase: "" runs the mutating then the validating phase, as the API server
	// does; "validating" runs the validating phase alone, as if the mutating webhook
	// had not run.
	Phase           policy.Phase      `json:"phase"`
	Operation       string            `json:"operation"`
	SubResource     string            `json:"subResource"`
	Namespace       string            `json:"namespace"`
	NamespaceLabels map[string]string `json:"namespaceLabels"`
	Username        string            `json:"username"`
	// Policy holds spec fields that override the default policy.
	Policy     map[string]any     `json:"policy"`
	ConfigMaps []corev1.ConfigMap `json:"configMaps"`
	Object     json.RawMessage    `json:"object"`
	OldObject  json.RawMessage    `json:"oldObject"`
}

type configMaps []corev1.ConfigMap

func (cms configMaps) ConfigMapData(_ context.Context, namespace, name string) (map[string]string, error) {
	for _, cm := range cms {
		ns := cm.Namespace
		if ns == "" {
			ns = "default"
		}
		if ns == namespace && cm.Name == name {
			return cm.Data, nil
		}
	}
	return nil, policy.ErrConfigMapNotFound
}

func loadFixture(t testing.TB, path string) (*fixture, *policy.Engine, policy.Request) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{}
	if err := sigsyaml.UnmarshalStrict(data, f); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	engine := engineWith(t, f.Policy)
	req := policy.Request{
		Operation:       admissionv1.Create,
		SubResource:     f.SubResource,
		Namespace:       f.Namespace,
		NamespaceLabels: f.NamespaceLabels,
		UserInfo:        authenticationv1.UserInfo{Username: f.Username},
		Object:          decode(t, path, f.Object),
		ConfigMaps:      configMaps(f.ConfigMaps),
	}
	if f.Operation != "" {
		req.Operation = admissionv1.Operation(f.Operation)
	}
	if len(f.OldObject) > 0 {
		req.OldObject = decode(t, path, f.OldObject)
	}
	return f, engine, req
}

func engineWith(t testing.TB, overrides map[string]any) *policy.Engine {
	t.Helper()
	p := config.Default()
	if len(overrides) > 0 {
		doc, err := sigsyaml.Marshal(map[string]any{"apiVersion": config.APIVersion, "kind": config.Kind, "spec": overrides})
		if err != nil {
			t.Fatal(err)
		}
		if p, err = config.Parse("fixture policy", doc); err != nil {
			t.Fatal(err)
		}
	}
	e, err := policy.New(p)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func decode(t testing.TB, path string, raw json.RawMessage) runtime.Object {
	t.Helper()
	obj, err := manifest.DecodeObject(raw)
	if err != nil {
		t.Fatalf("%s: object: %v", path, err)
	}
	return obj
}

// evaluate runs a fixture the way its phase says.
func evaluate(t testing.TB, f *fixture, e *policy.Engine, req policy.Request) policy.Result {
	t.Helper()
	if f.Phase == policy.Validating {
		req.Phase = policy.Validating
		return e.Evaluate(context.Background(), &req)
	}
	r, err := e.Admit(context.Background(), req)
	if err != nil {
		t.Fatalf("admit: %v", err)
	}
	return r
}

func TestFixtures(t *testing.T) {
	for _, dir := range []string{"pass", "fail"} {
		files, err := filepath.Glob(filepath.Join("testdata", dir, "*.yaml"))
		if err != nil || len(files) == 0 {
			t.Fatalf("no fixtures in testdata/%s: %v", dir, err)
		}
		for _, path := range files {
			t.Run(dir+"/"+strings.TrimSuffix(filepath.Base(path), ".yaml"), func(t *testing.T) {
				f, engine, req := loadFixture(t, path)
				r := evaluate(t, f, engine, req)
				if want := dir == "pass"; r.Allowed != want {
					t.Errorf("allowed = %v, want %v; violations: %+v", r.Allowed, want, r.Violations)
				}
				if dir == "fail" && len(f.Expect) == 0 {
					t.Errorf("a fail fixture must list the rules it expects")
				}
				assertRules(t, "violation", violationRules(r), f.Expect)
				assertRules(t, "warning", warningRules(t, r), f.Warn)
				assertRules(t, "audit annotation", auditKeys(r), toRules(f.Audit))
				if got := len(r.Patch) > 0; got != f.Mutate {
					t.Errorf("mutated = %v, want %v; patch: %+v", got, f.Mutate, r.Patch)
				}
				if got := r.Exempt != ""; got != f.Exempt {
					t.Errorf("exempt = %q, want exempt %v", r.Exempt, f.Exempt)
				}
				assertIdempotent(t, engine, req, r)
				compareGolden(t, strings.TrimSuffix(path, ".yaml")+".golden.json", r)
			})
		}
	}
}

// assertIdempotent re-runs the mutating phase on the patched object: a reinvoked
// webhook must have nothing left to change.
func assertIdempotent(t *testing.T, e *policy.Engine, req policy.Request, r policy.Result) {
	t.Helper()
	if len(r.Patch) == 0 {
		return
	}
	patched, err := policy.ApplyPatch(req.Object, r.Patch)
	if err != nil {
		t.Fatalf("patch does not apply: %v", err)
	}
	req.Object, req.Phase = patched, policy.Mutating
	if again := e.Evaluate(context.Background(), &req); len(again.Patch) != 0 {
		t.Errorf("mutation is not idempotent: second patch %+v", again.Patch)
	}
}

func violationRules(r policy.Result) []policy.RuleID {
	var rules []policy.RuleID
	for _, v := range r.Violations {
		rules = append(rules, v.Rule)
	}
	return rules
}

// warningRules reads the rule from each warning, which starts "gpuguard RULE: ".
func warningRules(t *testing.T, r policy.Result) []policy.RuleID {
	var rules []policy.RuleID
	for _, w := range r.Warnings {
		rest, ok := strings.CutPrefix(w, "gpuguard ")
		rule, _, ok2 := strings.Cut(rest, ":")
		if !ok || !ok2 {
			t.Errorf("warning %q does not name its rule", w)
			continue
		}
		if len(w) > 120 {
			t.Errorf("warning is %d characters long, over 120: %q", len(w), w)
		}
		rules = append(rules, policy.RuleID(rule))
	}
	return rules
}

func auditKeys(r policy.Result) []policy.RuleID {
	var keys []policy.RuleID
	for k := range r.AuditAnnotations {
		keys = append(keys, policy.RuleID(k))
	}
	return keys
}

func toRules(s []string) []policy.RuleID {
	var out []policy.RuleID
	for _, x := range s {
		out = append(out, policy.RuleID(x))
	}
	return out
}

func assertRules(t *testing.T, what string, got, want []policy.RuleID) {
	t.Helper()
	got, want = slices.Compact(slices.Sorted(slices.Values(got))), slices.Compact(slices.Sorted(slices.Values(want)))
	if !slices.Equal(got, want) {
		t.Errorf("%s rules = %v, want %v", what, got, want)
	}
}

func compareGolden(t *testing.T, path string, r policy.Result) {
	t.Helper()
	got, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("golden file missing (run go test ./policy -update): %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("result differs from %s (run go test ./policy -update after checking the change):\ngot:\n%s", path, got)
	}
}
