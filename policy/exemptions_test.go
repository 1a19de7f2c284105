package policy_test

import (
	"strings"
	"testing"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/policy"
)

func TestWaivers(t *testing.T) {
	pair := func(name string, rules ...string) config.ServiceAccountExemption {
		return config.ServiceAccountExemption{Namespace: "infra", Name: name, Rules: rules}
	}
	for _, tc := range []struct {
		name    string
		entries []config.ServiceAccountExemption
		// want: the rules of infra/a, "*" for every rule; or the error.
		want    []policy.RuleID
		whole   bool
		wantErr string
	}{
		{name: "no rules: every rule", entries: []config.ServiceAccountExemption{pair("a")}, whole: true},
		{name: "named rules", entries: []config.ServiceAccountExemption{pair("a", "privileged", "sensitive-hostpath")},
			want: []policy.RuleID{policy.RuleHostPathLink, policy.RulePrivileged, policy.RuleSensitiveHostPath}},
		{name: "inject-void brings the rules that check its work",
			entries: []config.ServiceAccountExemption{pair("a", "inject-void")},
			want:    []policy.RuleID{policy.RuleFinalState, policy.RuleInjectVoid, policy.RuleVoidHidesGPU}},
		{name: "two entries add up", entries: []config.ServiceAccountExemption{pair("a", "privileged"), pair("a", "capabilities")},
			want: []policy.RuleID{policy.RuleCapabilities, policy.RulePrivileged}},
		{name: "an entry without rules widens to every rule",
			entries: []config.ServiceAccountExemption{pair("a", "privileged"), pair("a")}, whole: true},
		{name: "unknown rule", entries: []config.ServiceAccountExemption{pair("a", "privileged", "priviledged")},
			wantErr: `spec.exemptions.serviceAccounts[0].rules[1]: Unsupported value: "priviledged"`},
		{name: "namespace-mode is no check to waive", entries: []config.ServiceAccountExemption{pair("a", "namespace-mode")},
			wantErr: `spec.exemptions.serviceAccounts[0].rules[0]: Unsupported value: "namespace-mode"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := config.Default()
			p.Spec.Exemptions.ServiceAccounts = tc.entries
			w, err := policy.NewWaivers(&p.Spec)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one with %q", err, tc.wantErr)
				}
				if _, err := policy.New(p); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("policy.New: error %v, want one with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			rules, ok := w.Of(config.ServiceAccountRef{Namespace: "infra", Name: "a"})
			if !ok {
				t.Fatal("infra/a not exempt")
			}
			if got := rules == nil; got != tc.whole {
				t.Fatalf("whole exemption %v, want %v", got, tc.whole)
			}
			if !tc.whole && strings.Join(ids(rules.Sorted()), ",") != strings.Join(ids(tc.want), ",") {
				t.Errorf("waives %v, want %v", rules.Sorted(), tc.want)
			}
			if _, ok := w.Of(config.ServiceAccountRef{Namespace: "infra", Name: "b"}); ok {
				t.Error("infra/b exempt without an entry")
			}
		})
	}
}

func ids(rules []policy.RuleID) []string {
	out := make([]string, len(rules))
	for i, r := range rules {
		out[i] = string(r)
	}
	return out
}
