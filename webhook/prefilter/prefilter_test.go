package prefilter

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/gpuguard/gpuguard/cel"
	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/internal/wellknown"
)

const (
	mutatingConfig   = "gpuguard-mutating"
	validatingConfig = "gpuguard-validating"
	mutatePods       = "mutate.pods.gpuguard.io"
	validatePods     = "validate.pods.gpuguard.io"
	validateOther    = "validate.configmaps.gpuguard.io"
)

// own is a match condition the chart put on a webhook: the pre-filter
// leaves it be.
var own = admissionregistrationv1.MatchCondition{Name: "not-node", Expression: `!request.userInfo.username.startsWith("system:node:")`}

func service(path string) admissionregistrationv1.WebhookClientConfig {
	return admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{Namespace: "gpuguard", Name: "gpuguard", Path: &path}}
}

// configurations are gpuguard's two webhook configurations, each with a pod
// webhook and, in the validating one, a webhook the pre-filter must not
// touch; and another product's configuration with a webhook of the same
// name as gpuguard's.
func configurations() []client.Object {
	none := admissionregistrationv1.SideEffectClassNone
	return []client.Object{
		&admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: mutatingConfig},
			Webhooks: []admissionregistrationv1.MutatingWebhook{
				{Name: mutatePods, ClientConfig: service("/mutate"), SideEffects: &none, AdmissionReviewVersions: []string{"v1"},
					MatchConditions: []admissionregistrationv1.MatchCondition{own}},
			}},
		&admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: validatingConfig},
			Webhooks: []admissionregistrationv1.ValidatingWebhook{
				{Name: validatePods, ClientConfig: service("/validate"), SideEffects: &none, AdmissionReviewVersions: []string{"v1"}},
				{Name: validateOther, ClientConfig: service("/configmaps"), SideEffects: &none, AdmissionReviewVersions: []string{"v1"},
					MatchConditions: []admissionregistrationv1.MatchCondition{own}},
			}},
		&admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "someone-else"},
			Webhooks: []admissionregistrationv1.ValidatingWebhook{
				{Name: validatePods, ClientConfig: service("/theirs"), SideEffects: &none, AdmissionReviewVersions: []string{"v1"}},
			}},
	}
}

func newSync(t *testing.T, webhooks ...string) (*Sync, client.Client) {
	t.Helper()
	c := fake.NewClientBuilder().WithObjects(configurations()...).WithReturnManagedFields().Build()
	return &Sync{
		Client: c, Reader: c, MutatingConfig: mutatingConfig, ValidatingConfig: validatingConfig, Webhooks: webhooks,
		Syncs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "syncs"}, []string{"result"}),
		Log:   logr.Discard(),
	}, c
}

// webhook is what the test reads of one webhook.
type webhook struct {
	conditions []admissionregistrationv1.MatchCondition
	path       string
}

// webhooks reads the webhooks of a configuration by name.
func webhooks(t *testing.T, c client.Reader, kind, name string) map[string]webhook {
	t.Helper()
	out := map[string]webhook{}
	key := client.ObjectKey{Name: name}
	if kind == "mutating" {
		m := &admissionregistrationv1.MutatingWebhookConfiguration{}
		if err := c.Get(context.Background(), key, m); err != nil {
			t.Fatal(err)
		}
		for _, w := range m.Webhooks {
			out[w.Name] = webhook{w.MatchConditions, *w.ClientConfig.Service.Path}
		}
		return out
	}
	v := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := c.Get(context.Background(), key, v); err != nil {
		t.Fatal(err)
	}
	for _, w := range v.Webhooks {
		out[w.Name] = webhook{w.MatchConditions, *w.ClientConfig.Service.Path}
	}
	return out
}

func prefilter(t *testing.T, p *config.Policy) admissionregistrationv1.MatchCondition {
	t.Helper()
	expr, err := cel.Prefilter(p)
	if err != nil {
		t.Fatal(err)
	}
	return admissionregistrationv1.MatchCondition{Name: cel.PrefilterName, Expression: expr}
}

func TestApplyFiltersExactlyTheNamedWebhooks(t *testing.T) {
	s, c := newSync(t, mutatePods, validatePods)
	p := config.Default()
	if err := s.Apply(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	want := prefilter(t, p)

	mutating := webhooks(t, c, "mutating", mutatingConfig)
	if got := mutating[mutatePods].conditions; !slices.Equal(got, []admissionregistrationv1.MatchCondition{own, want}) {
		t.Errorf("%s conditions %+v, want its own and the pre-filter", mutatePods, got)
	}
	validating := webhooks(t, c, "validating", validatingConfig)
	if got := validating[validatePods].conditions; !slices.Equal(got, []admissionregistrationv1.MatchCondition{want}) {
		t.Errorf("%s conditions %+v, want the pre-filter", validatePods, got)
	}
	if got := validating[validateOther].conditions; !slices.Equal(got, []admissionregistrationv1.MatchCondition{own}) {
		t.Errorf("%s, not named, has conditions %+v", validateOther, got)
	}
	// The apply holds names and conditions only: the rest stays.
	if mutating[mutatePods].path != "/mutate" || validating[validatePods].path != "/validate" || validating[validateOther].path != "/configmaps" || len(validating) != 2 {
		t.Errorf("the apply changed the webhooks: %+v %+v", mutating, validating)
	}
	if got := webhooks(t, c, "validating", "someone-else")[validatePods].conditions; len(got) != 0 {
		t.Errorf("another configuration's webhook of the same name got conditions %+v", got)
	}
	m := &admissionregistrationv1.MutatingWebhookConfiguration{}
	if err := c.Get(context.Background(), client.ObjectKey{Name: mutatingConfig}, m); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(m.ManagedFields, func(f metav1.ManagedFieldsEntry) bool {
		return f.Manager == wellknown.PrefilterFieldManager && f.Operation == metav1.ManagedFieldsOperationApply
	}) {
		t.Errorf("not applied by field manager %s: %+v", wellknown.PrefilterFieldManager, m.ManagedFields)
	}
	if got := testutil.ToFloat64(s.Syncs.WithLabelValues("success")); got != 1 {
		t.Errorf("success syncs %v, want 1", got)
	}
}

func TestApplyFollowsThePolicy(t *testing.T) {
	s, c := newSync(t, mutatePods, validatePods)
	ctx := context.Background()
	if err := s.Apply(ctx, config.Default()); err != nil {
		t.Fatal(err)
	}
	p := config.Default()
	p.Spec.Env.ExtraDeviceVariables = append(p.Spec.Env.ExtraDeviceVariables, "DOCKER_RESOURCE_GPU")
	want := prefilter(t, p)
	if want == prefilter(t, config.Default()) {
		t.Fatal("the edited policy renders the same pre-filter: the test needs another edit")
	}
	if err := s.Apply(ctx, p); err != nil {
		t.Fatal(err)
	}
	if got := webhooks(t, c, "mutating", mutatingConfig)[mutatePods].conditions; !slices.Equal(got, []admissionregistrationv1.MatchCondition{own, want}) {
		t.Errorf("after a policy edit %s has %+v", mutatePods, got)
	}
	if got := webhooks(t, c, "validating", validatingConfig)[validatePods].conditions; !slices.Equal(got, []admissionregistrationv1.MatchCondition{want}) {
		t.Errorf("after a policy edit %s has %+v", validatePods, got)
	}
}

func TestApplyDropsTheConditionFromAWebhookNoLongerNamed(t *testing.T) {
	s, c := newSync(t, mutatePods, validatePods)
	ctx := context.Background()
	p := config.Default()
	if err := s.Apply(ctx, p); err != nil {
		t.Fatal(err)
	}
	s.Webhooks = []string{mutatePods}
	if err := s.Apply(ctx, p); err != nil {
		t.Fatal(err)
	}
	if got := webhooks(t, c, "validating", validatingConfig)[validatePods].conditions; len(got) != 0 {
		t.Errorf("%s, no longer named, keeps %+v", validatePods, got)
	}
	if got := webhooks(t, c, "mutating", mutatingConfig)[mutatePods].conditions; !slices.Equal(got, []admissionregistrationv1.MatchCondition{own, prefilter(t, p)}) {
		t.Errorf("%s has %+v", mutatePods, got)
	}
}

func TestApplyMissingConfiguration(t *testing.T) {
	s, c := newSync(t, mutatePods, validatePods)
	s.ValidatingConfig = "gpuguard-gone"
	err := s.Apply(context.Background(), config.Default())
	if err == nil || !strings.Contains(err.Error(), "ValidatingWebhookConfiguration gpuguard-gone") || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("want an error naming the missing configuration, got %v", err)
	}
	if got := testutil.ToFloat64(s.Syncs.WithLabelValues("error")); got != 1 {
		t.Errorf("error syncs %v, want 1", got)
	}
	// Nothing is created in its place.
	if err := c.Get(context.Background(), client.ObjectKey{Name: "gpuguard-gone"}, &admissionregistrationv1.ValidatingWebhookConfiguration{}); err == nil {
		t.Error("the apply created the missing configuration")
	}
}

func TestApplyWebhookInNeitherConfiguration(t *testing.T) {
	s, _ := newSync(t, mutatePods, "validate.typo.gpuguard.io")
	err := s.Apply(context.Background(), config.Default())
	if err == nil || !strings.Contains(err.Error(), "validate.typo.gpuguard.io") || !strings.Contains(err.Error(), "neither") {
		t.Fatalf("want an error naming the unknown webhook, got %v", err)
	}
	if got := testutil.ToFloat64(s.Syncs.WithLabelValues("error")); got != 1 {
		t.Errorf("error syncs %v, want 1", got)
	}
}

func TestApplyOneConfiguration(t *testing.T) {
	// With only the validating configuration named, the mutating one is
	// neither read nor touched.
	s, c := newSync(t, validatePods)
	s.MutatingConfig = ""
	p := config.Default()
	if err := s.Apply(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	if got := webhooks(t, c, "validating", validatingConfig)[validatePods].conditions; !slices.Equal(got, []admissionregistrationv1.MatchCondition{prefilter(t, p)}) {
		t.Errorf("%s has %+v", validatePods, got)
	}
	if got := webhooks(t, c, "mutating", mutatingConfig)[mutatePods].conditions; !slices.Equal(got, []admissionregistrationv1.MatchCondition{own}) {
		t.Errorf("%s, in a configuration not named, has %+v", mutatePods, got)
	}
}
