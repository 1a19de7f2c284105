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

	"github.com/gpuguard/gpuguard/policy"
	"github.com/gpuguard/gpuguard/testsupport/fixtures"
)

var update = flag.Bool("update", false, "rewrite the golden files of testdata/{pass,fail}")

// loadFixture reads a fixture with its engine and request.
func loadFixture(t testing.TB, path string) (*fixtures.Fixture, *policy.Engine, policy.Request) {
	t.Helper()
	f, err := fixtures.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	engine, err := f.Engine()
	if err != nil {
		t.Fatal(err)
	}
	req, err := f.Request()
	if err != nil {
		t.Fatal(err)
	}
	return f, engine, req
}

// evaluate runs a fixture the way its phase says.
func evaluate(t testing.TB, f *fixtures.Fixture, e *policy.Engine, req policy.Request) policy.Result {
	t.Helper()
	r, err := f.Evaluate(context.Background(), e, req)
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

// warningRules are the rules of the warnings; each warning must fit an
// admission warning line.
func warningRules(t *testing.T, r policy.Result) []policy.RuleID {
	var rules []policy.RuleID
	for _, w := range r.Warnings {
		fix := w.Message[strings.LastIndex(w.Message, "; ")+1:]
		if s := w.String(); len(s) > policy.MaxWarning || !strings.HasSuffix(s, fix) {
			t.Errorf("warning of %d bytes lost its fix %q: %q", len(s), fix, s)
		}
		// The same warning deep in a CronJob's template still keeps its fix.
		if i := strings.Index(w.Path, "containers["); i >= 0 {
			deep := w
			deep.Path = "spec.jobTemplate.spec.template.spec.initContainers[12].env[345]" + w.Path[i+len("containers[0]"):]
			if s := deep.String(); len(s) > policy.MaxWarning || !strings.HasSuffix(s, fix) {
				t.Errorf("deep warning of %d bytes lost its fix %q: %q", len(s), fix, s)
			}
		}
		rules = append(rules, w.Rule)
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

// TestEveryRuleHasFixtures: each registered rule has a pass fixture named
// after it (where it does not fire) and a fixture where it fires: it denies,
// warns or records an audit annotation, or, for a mutation, patches.
func TestEveryRuleHasFixtures(t *testing.T) {
	all, err := fixtures.All("testdata")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range policy.Registry() {
		prefix := string(r.ID) + "-"
		pass := slices.ContainsFunc(all, func(f *fixtures.Fixture) bool {
			return f.Pass() && strings.HasPrefix(strings.TrimPrefix(f.Name, "pass/"), prefix)
		})
		fires := slices.ContainsFunc(all, func(f *fixtures.Fixture) bool {
			named := strings.HasPrefix(f.Name[strings.Index(f.Name, "/")+1:], prefix)
			return slices.Contains(f.Expect, r.ID) || slices.Contains(f.Warn, r.ID) || slices.Contains(f.Audit, string(r.ID)) || (named && f.Mutate)
		})
		if !pass || !fires {
			t.Errorf("rule %s: a pass fixture named %s… found: %v; a fixture where it fires found: %v", r.ID, prefix, pass, fires)
		}
	}
}
