package cel_test

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/gpuguard/gpuguard/cel"
	"github.com/gpuguard/gpuguard/policy"
)

var updateDocs = flag.Bool("update-docs", false, "rewrite the generated sections of docs/policy.md and docs/cel-backstop.md")

// ruleTable is the rule table of docs/policy.md, from the registry.
func ruleTable() string {
	var b strings.Builder
	b.WriteString("| rule | what it judges (default effect) |\n|---|---|\n")
	for _, r := range policy.Registry() {
		fmt.Fprintf(&b, "| `%s` | %s |\n", r.ID, r.Summary)
	}
	return b.String()
}

// gapTable is docs/cel-backstop.md's list of what the backstop leaves to the
// webhook, from the registry and the backstop's own gaps.
func gapTable() string {
	var b strings.Builder
	b.WriteString("| rule or part | left to the webhook |\n|---|---|\n")
	for _, g := range cel.WebhookOnly {
		fmt.Fprintf(&b, "| `%s` | %s |\n", g.Rule, g.Why)
	}
	return b.String()
}

// TestGeneratedDocs fails when a generated section of the docs no longer
// matches the registry; go test ./cel -run TestGeneratedDocs -update-docs
// rewrites them.
func TestGeneratedDocs(t *testing.T) {
	for _, doc := range []struct{ path, name, text string }{
		{"../docs/policy.md", "rules", ruleTable()},
		{"../docs/cel-backstop.md", "gaps", gapTable()},
	} {
		data, err := os.ReadFile(doc.path)
		if err != nil {
			t.Fatal(err)
		}
		begin, end := "<!-- BEGIN GENERATED: "+doc.name+" -->\n", "<!-- END GENERATED: "+doc.name+" -->"
		before, rest, ok1 := strings.Cut(string(data), begin)
		current, after, ok2 := strings.Cut(rest, end)
		if !ok1 || !ok2 {
			t.Fatalf("%s lacks the markers %q and %q", doc.path, strings.TrimSpace(begin), end)
		}
		if current == doc.text {
			continue
		}
		if !*updateDocs {
			t.Errorf("%s: the %s section is stale; run go test ./cel -run TestGeneratedDocs -update-docs", doc.path, doc.name)
			continue
		}
		if err := os.WriteFile(doc.path, []byte(before+begin+doc.text+end+after), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
