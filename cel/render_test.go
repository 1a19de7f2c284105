package cel

import (
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/policy"
)

func parse(t *testing.T, spec string) *config.Policy {
	t.Helper()
	p, err := config.Parse("p.yaml", []byte("apiVersion: gpuguard.io/v1alpha1\nkind: GPUGuardPolicy\nspec:\n"+spec))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRenderDefault(t *testing.T) {
	p, err := Render(config.Default(), Options{ExcludedNamespaces: []string{"gpuguard"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := p.ValidatingBinding.Spec.ValidationActions; len(got) != 1 || got[0] != admissionregistrationv1.Deny {
		t.Errorf("enforce must render Deny, got %v", got)
	}
	sel := p.ValidatingBinding.Spec.MatchResources.NamespaceSelector.MatchExpressions[0]
	if sel.Key != "kubernetes.io/metadata.name" || strings.Join(sel.Values, ",") != "gpuguard,kube-node-lease,kube-system" {
		t.Errorf("namespace selector %+v", sel)
	}
	rules := map[string]bool{}
	for _, v := range p.Validating.Spec.Validations {
		rule := strings.TrimSuffix(strings.SplitN(strings.TrimPrefix(v.Message, "gpuguard backstop ["), "]", 2)[0], "]")
		rules[rule] = true
	}
	for _, want := range []string{"device-env", "protected-env", "env-value-from", "envfrom-prefix", "device-list-mount", "device-annotation", "sensitive-hostpath", "privileged", "final-state"} {
		if !rules[want] {
			t.Errorf("rule %s is not rendered", want)
		}
	}
	for _, advisory := range []string{"capabilities", "nvidia-runtime-class", "envfrom-unprefixed", "injector-annotation"} {
		if rules[advisory] {
			t.Errorf("%s is a warning or needs inspection in the default policy; it must be webhook-only", advisory)
		}
	}
	if c := p.Validating.Spec.MatchConditions; len(c) != 2 || c[0].Expression != AnnotationsChanged || c[1].Name != PrefilterName {
		t.Errorf("no exemptions: the status filter and the pre-filter are the only match conditions: %+v", c)
	}
	if !slices.ContainsFunc(p.Validating.Spec.MatchConstraints.ResourceRules, func(r admissionregistrationv1.NamedRuleWithOperations) bool {
		return slices.Contains(r.Resources, "pods/status") && slices.Contains(r.Operations, admissionregistrationv1.Update)
	}) {
		t.Error("pods/status updates are not judged")
	}
	mut := p.Mutating.Spec.Mutations[0].JSONPatch.Expression
	for _, want := range []string{`"/spec/containers/"`, `"/spec/initContainers/"`, `"/spec/ephemeralContainers/"`, `value: "void"`} {
		if !strings.Contains(mut, want) {
			t.Errorf("the void injection lacks %s", want)
		}
	}
}

func TestRenderFollowsThePolicy(t *testing.T) {
	p, err := Render(parse(t, `  mode: warn
  injectVoid: false
  env:
    extraDeviceVariables: [DOCKER_RESOURCE_GPU]
    unprefixedEnvFromOnGPU: deny
  advisories: {privileged: warn, capabilities: deny, nvidiaRuntimeClass: deny}
  exemptions:
    namespaces: [gpu-operator]
    serviceAccounts: [{namespace: ci, name: smoke}]
    usernames: [system:admin]
`), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := p.ValidatingBinding.Spec.ValidationActions; got[0] != admissionregistrationv1.Warn {
		t.Errorf("warn must render Warn, got %v", got)
	}
	all := ""
	for _, v := range p.Validating.Spec.Validations {
		all += v.Message + "\n" + v.Expression + "\n"
	}
	for _, want := range []string{"[capabilities]", "[nvidia-runtime-class]", "[envfrom-unprefixed]", `"DOCKER_RESOURCE_GPU"`} {
		if !strings.Contains(all, want) {
			t.Errorf("rendered validations lack %s", want)
		}
	}
	if strings.Contains(all, "[privileged]") {
		t.Error("privileged at warn must be left to the webhook")
	}
	if strings.Contains(all, "[final-state]") {
		t.Error("with injectVoid off there is no final-state rule")
	}
	// One injection per container list, each behind the toolkit's
	// privileged test.
	if expr := p.Mutating.Spec.Mutations[0].JSONPatch.Expression; strings.Count(expr, ".transformList(i, c, "+policy.ToolkitPrivilegedCEL+" && ") != 3 {
		t.Error("with injectVoid off only containers the toolkit counts as privileged get void")
	}
	conds := ""
	for _, c := range p.Validating.Spec.MatchConditions {
		conds += c.Expression
	}
	if !strings.Contains(conds, `"system:admin"`) || !strings.Contains(conds, `"ci/smoke"`) {
		t.Errorf("exemptions not carried over: %s", conds)
	}
	if !strings.Contains(strings.Join(p.MutatingBinding.Spec.MatchResources.NamespaceSelector.MatchExpressions[0].Values, ","), "gpu-operator") {
		t.Error("an exempt namespace must be left out of the bindings")
	}
}

func TestRelaxedNamespacesAreLeftToTheWebhook(t *testing.T) {
	for _, tc := range []struct {
		spec string
		want string // values of the mode label left out, "" for none
	}{
		{"  mode: enforce\n", ""},
		{"  mode: enforce\n  namespaceModeOverride: Any\n", "warn,audit"},
		{"  mode: warn\n  namespaceModeOverride: Any\n", "audit"},
		{"  mode: audit\n  namespaceModeOverride: Any\n", ""},
	} {
		p, err := Render(parse(t, tc.spec), Options{})
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		for _, e := range p.ValidatingBinding.Spec.MatchResources.NamespaceSelector.MatchExpressions {
			if e.Key == "gpuguard.io/mode" {
				got = strings.Join(e.Values, ",")
			}
		}
		if got != tc.want {
			t.Errorf("%q: mode label values left out = %q, want %q", tc.spec, got, tc.want)
		}
		if len(p.MutatingBinding.Spec.MatchResources.NamespaceSelector.MatchExpressions) != 1 {
			t.Errorf("%q: the void injection applies in every mode", tc.spec)
		}
	}
}

// TestKAIGuardOnly: for API servers without MutatingAdmissionPolicy, the
// KAI ConfigMap guard is rendered alone, and only while fractions are on.
func TestKAIGuardOnly(t *testing.T) {
	p := config.Default()
	p.Spec.Integrations.KAIScheduler = config.KAIScheduler{Fractions: true, SchedulerNames: []string{"kai-scheduler"},
		BinderServiceAccounts: []string{"system:serviceaccount:kai-scheduler:binder"}}
	out, err := Render(p, Options{Name: "b", KAIGuardOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, o := range out.Objects() {
		kinds = append(kinds, o.GetObjectKind().GroupVersionKind().Kind)
	}
	if !slices.Equal(kinds, []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}) || out.KAIGuard.Name != KAIGuardName("b") {
		t.Errorf("guard alone rendered %v", kinds)
	}
	p.Spec.Integrations.KAIScheduler.Fractions = false
	if out, err := Render(p, Options{Name: "b", KAIGuardOnly: true}); err != nil || len(out.Objects()) != 0 {
		t.Errorf("without fractions the guard alone is nothing, got %d objects (%v)", len(out.Objects()), err)
	}
}
