package charts

import (
	"regexp"
	"strings"
	"testing"

	"github.com/gpuguard/gpuguard/config"
)

// policyBlockKey starts the block scalar that holds a policy document, in
// the policy ConfigMap and in the policy-check hook.
var policyBlockKey = regexp.MustCompile(`^( *)` + regexp.QuoteMeta(config.ConfigMapKey) + `: \|[-+]?$`)

// foldPolicies writes each copy of the default policy in a golden rendering
// (in the policy ConfigMap and in the policy-check hook) as one line: the
// default is checked once, by TestDefaultPolicyIsEmbedded, so a change to it
// rewrites no golden. A policy the chart renders from its values holds only
// what the values set, and stays as it is.
func foldPolicies(golden string) string {
	marks := map[string]string{
		strings.TrimRight(string(config.DefaultYAML()), "\n"): defaultPolicyMark,
		strings.TrimRight(chartDefaultPolicy(), "\n"):         chartDefaultPolicyMark,
	}
	lines := strings.Split(golden, "\n")
	var out []string
	for i := 0; i < len(lines); i++ {
		out = append(out, lines[i])
		m := policyBlockKey.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		indent := m[1] + "  "
		j := i + 1
		var doc []string
		for ; j < len(lines) && (lines[j] == "" || strings.HasPrefix(lines[j], indent)); j++ {
			doc = append(doc, strings.TrimPrefix(lines[j], indent))
		}
		if mark, ok := marks[strings.TrimRight(strings.Join(doc, "\n"), "\n")]; ok {
			out = append(out, indent+mark)
			for j > i+1 && lines[j-1] == "" { // blank lines after the block stay
				j--
			}
			i = j - 1
		}
	}
	return strings.Join(out, "\n")
}

const (
	defaultPolicyMark      = "# the default policy (config/default.yaml), byte for byte: TestDefaultPolicyIsEmbedded checks it"
	chartDefaultPolicyMark = "# the default policy in warn mode, the chart's default: TestDefaultPolicyIsEmbedded checks it"
)

// chartDefaultPolicy is the policy the chart installs with nothing set: the
// built-in default with its mode warn, so that a first install denies nothing.
func chartDefaultPolicy() string {
	return strings.Replace(string(config.DefaultYAML()), "\n  mode: enforce\n", "\n  mode: warn\n", 1)
}

// TestFoldPolicies: a copy of the default folds to one line at its
// indentation, another policy stays whole, and what surrounds them is kept.
func TestFoldPolicies(t *testing.T) {
	indented := func(doc, indent string) string {
		var b strings.Builder
		for _, l := range strings.Split(strings.TrimRight(doc, "\n"), "\n") {
			if l != "" {
				b.WriteString(indent + l)
			}
			b.WriteString("\n")
		}
		return b.String()
	}
	def := string(config.DefaultYAML())
	changed := strings.Replace(def, "mode: enforce", "mode: audit", 1)
	if changed == def || chartDefaultPolicy() == def {
		t.Fatal("the default policy has no 'mode: enforce' line to change")
	}
	golden := "data:\n  policy.yaml: |\n" + indented(def, "    ") + "---\nkind: Job\n    - |\n      policy.yaml: |-\n" +
		indented(changed, "        ") + "---\n  policy.yaml: |\n" + indented(chartDefaultPolicy(), "    ") + "after: 1\n"
	got := foldPolicies(golden)
	want := "data:\n  policy.yaml: |\n    " + defaultPolicyMark + "\n---\nkind: Job\n    - |\n      policy.yaml: |-\n" +
		indented(changed, "        ") + "---\n  policy.yaml: |\n    " + chartDefaultPolicyMark + "\n" + "after: 1\n"
	if got != want {
		t.Errorf("folded:\n%s\nwant:\n%s", got, want)
	}
}
