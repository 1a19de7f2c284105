package policysource

import (
	"context"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/internal/wellknown"
)

var policyKey = types.NamespacedName{Namespace: "gpuguard", Name: "gpuguard-policy"}

// newReconciler reconciles policyKey through a fake client, with the
// built-in policy as fallback when fallback is set.
func newReconciler(fallback bool) (*Reconciler, client.Client, *events.FakeRecorder) {
	c := fake.NewClientBuilder().Build()
	rec := events.NewFakeRecorder(16)
	r := &Reconciler{Key: policyKey, Reader: c, APIReader: c, Source: New(testMetrics(), logr.Discard()), Events: rec,
		Reloads:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "reloads"}, []string{"result"}),
		MissingExemptNS: prometheus.NewGauge(prometheus.GaugeOpts{Name: "missing"}),
		FallbackInForce: prometheus.NewGauge(prometheus.GaugeOpts{Name: "fallback"}), Log: logr.Discard()}
	if fallback {
		r.Fallback = config.DefaultYAML()
	}
	return r, c, rec
}

func (r *Reconciler) reconcileOnce(t *testing.T) {
	t.Helper()
	if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: policyKey}); err != nil {
		t.Fatal(err)
	}
}

func writePolicyConfigMap(t *testing.T, c client.Client, doc string) {
	t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: policyKey.Namespace, Name: policyKey.Name},
		Data: map[string]string{config.ConfigMapKey: doc}}
	if err := c.Create(context.Background(), cm); err != nil {
		if err := c.Update(context.Background(), cm); err != nil {
			t.Fatal(err)
		}
	}
}

func expectEvent(t *testing.T, rec *events.FakeRecorder, reason string) {
	t.Helper()
	select {
	case e := <-rec.Events:
		if !strings.Contains(e, " "+reason+" ") {
			t.Errorf("event %q, want %s", e, reason)
		}
	default:
		t.Errorf("no event, want %s", reason)
	}
}

// TestFallbackUntilTheConfigMapIsValid: a ConfigMap that has never held a
// valid policy leaves the built-in one in force, loudly; the first valid
// ConfigMap replaces it, and a bad edit after that keeps the ConfigMap's.
func TestFallbackUntilTheConfigMapIsValid(t *testing.T) {
	r, c, rec := newReconciler(true)
	r.reconcileOnce(t) // no ConfigMap at all
	expectEvent(t, rec, wellknown.ReasonPolicyMissing)
	expectEvent(t, rec, wellknown.ReasonPolicyFallback)
	if r.Source.Engine() == nil || r.Source.Ready(nil) != nil || testutil.ToFloat64(r.FallbackInForce) != 1 {
		t.Fatal("the built-in policy must be in force, ready and counted")
	}
	builtin := r.Source.Hash()

	writePolicyConfigMap(t, c, "apiVersion: gpuguard.io/v1alpha1\nkind: GPUGuardPolicy\nspec:\n  injectVoidd: false\n")
	r.reconcileOnce(t)
	expectEvent(t, rec, wellknown.ReasonPolicyInvalid)
	if r.Source.Hash() != builtin || testutil.ToFloat64(r.FallbackInForce) != 1 {
		t.Error("an invalid ConfigMap must leave the fallback in force")
	}

	writePolicyConfigMap(t, c, "apiVersion: gpuguard.io/v1alpha1\nkind: GPUGuardPolicy\nspec:\n  mode: warn\n")
	r.reconcileOnce(t)
	expectEvent(t, rec, wellknown.ReasonPolicyLoaded)
	if r.Source.Engine().Policy().Spec.Mode != config.ModeWarn || testutil.ToFloat64(r.FallbackInForce) != 0 {
		t.Fatal("the first valid ConfigMap must replace the fallback")
	}

	writePolicyConfigMap(t, c, "apiVersion: gpuguard.io/v1alpha1\nkind: GPUGuardPolicy\nspec:\n  mode: loud\n")
	r.reconcileOnce(t)
	expectEvent(t, rec, wellknown.ReasonPolicyInvalid)
	if r.Source.Engine().Policy().Spec.Mode != config.ModeWarn || testutil.ToFloat64(r.FallbackInForce) != 0 {
		t.Error("after a valid policy, a bad edit must keep it, not fall back")
	}
}

// TestNoFallbackStaysUnready: without a fallback, an invalid ConfigMap at
// start leaves no policy, so the webhook stays unready.
func TestNoFallbackStaysUnready(t *testing.T) {
	r, c, rec := newReconciler(false)
	writePolicyConfigMap(t, c, "apiVersion: gpuguard.io/v1alpha1\nkind: GPUGuardPolicy\nspec:\n  mode: loud\n")
	r.reconcileOnce(t)
	expectEvent(t, rec, wellknown.ReasonPolicyInvalid)
	if r.Source.Engine() != nil || r.Source.Ready(nil) == nil {
		t.Error("no policy must be in force")
	}
}

// TestUnguardedNamespacesThatDoNotExistAreReported: a namespace the
// webhook configurations leave out that does not exist is counted and,
// when the set changes, a Warning Event: a tenant who may create
// namespaces would otherwise get an unguarded one silently.
func TestUnguardedNamespacesThatDoNotExistAreReported(t *testing.T) {
	r, c, rec := newReconciler(false)
	r.Unguarded = []string{"kube-system", "cert-manager", "tigera-operator"}
	r.MissingUnguardedNS = prometheus.NewGauge(prometheus.GaugeOpts{Name: "unguarded"})
	ctx := context.Background()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-system"}}); err != nil {
		t.Fatal(err)
	}
	writePolicyConfigMap(t, c, string(config.DefaultYAML()))
	r.reconcileOnce(t)
	expectEvent(t, rec, wellknown.ReasonPolicyLoaded)
	if got := testutil.ToFloat64(r.MissingUnguardedNS); got != 2 {
		t.Errorf("missing unguarded namespaces %v, want 2 (cert-manager, tigera-operator)", got)
	}
	expectEvent(t, rec, wellknown.ReasonUnguardedNamespaceMissing)
	r.reconcileOnce(t)
	select {
	case e := <-rec.Events:
		t.Errorf("the same missing namespaces reported again: %s", e)
	default:
	}
	for _, ns := range []string{"cert-manager", "tigera-operator"} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	r.reconcileOnce(t)
	if got := testutil.ToFloat64(r.MissingUnguardedNS); got != 0 {
		t.Errorf("missing unguarded namespaces %v once they exist, want 0", got)
	}
}
