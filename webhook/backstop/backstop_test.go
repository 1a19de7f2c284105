package backstop

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/gpuguard/gpuguard/cel"
	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/internal/wellknown"
)

const name = "test-backstop"

// deletes counts the DELETE calls the fake API server receives.
type deletes struct{ n int }

func newSync(t *testing.T, d *deletes, objs ...client.Object) (*Sync, client.Client) {
	t.Helper()
	b := fake.NewClientBuilder().WithObjects(objs...).WithReturnManagedFields()
	if d != nil {
		b = b.WithInterceptorFuncs(interceptor.Funcs{Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			d.n++
			return c.Delete(ctx, obj, opts...)
		}})
	}
	c := b.Build()
	return &Sync{
		Client: c, Reader: c,
		Options: cel.Options{Name: name, ExcludedNamespaces: []string{"gpuguard", "gpu-operator"}},
		Syncs:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "syncs"}, []string{"result"}),
		Log:     logr.Discard(),
	}, c
}

func get[T client.Object](t *testing.T, c client.Reader, obj T, key string) T {
	t.Helper()
	if err := c.Get(context.Background(), client.ObjectKey{Name: key}, obj); err != nil {
		t.Fatalf("%T %s: %v", obj, key, err)
	}
	return obj
}

func absent(t *testing.T, c client.Reader, obj client.Object, key string) {
	t.Helper()
	if err := c.Get(context.Background(), client.ObjectKey{Name: key}, obj); !apierrors.IsNotFound(err) {
		t.Errorf("%T %s: want not found, got %v", obj, key, err)
	}
}

func excluded(match *admissionregistrationv1.MatchResources) []string {
	for _, e := range match.NamespaceSelector.MatchExpressions {
		if e.Key == "kubernetes.io/metadata.name" && e.Operator == metav1.LabelSelectorOpNotIn {
			return e.Values
		}
	}
	return nil
}

func managedBy(obj client.Object, manager string) bool {
	for _, m := range obj.GetManagedFields() {
		if m.Manager == manager && m.Operation == metav1.ManagedFieldsOperationApply {
			return true
		}
	}
	return false
}

func TestApplyCreatesRenderedObjects(t *testing.T) {
	s, c := newSync(t, nil)
	p := config.Default()
	p.Spec.Exemptions.Namespaces = []string{"batch-tools"}
	if err := s.Apply(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	want, err := cel.Render(p, s.Options)
	if err != nil {
		t.Fatal(err)
	}

	vap := get(t, c, &admissionregistrationv1.ValidatingAdmissionPolicy{}, name)
	if len(vap.Spec.Validations) == 0 || len(vap.Spec.Validations) != len(want.Validating.Spec.Validations) {
		t.Errorf("ValidatingAdmissionPolicy has %d validations, rendered %d", len(vap.Spec.Validations), len(want.Validating.Spec.Validations))
	}
	for i := range min(len(vap.Spec.Validations), len(want.Validating.Spec.Validations)) {
		if vap.Spec.Validations[i].Expression != want.Validating.Spec.Validations[i].Expression {
			t.Errorf("validation %d differs from the rendered one", i)
		}
	}
	mp := get(t, c, &admissionregistrationv1.MutatingAdmissionPolicy{}, name)
	if len(mp.Spec.Mutations) == 0 || len(mp.Spec.Mutations) != len(want.Mutating.Spec.Mutations) {
		t.Errorf("MutatingAdmissionPolicy has %d mutations, rendered %d", len(mp.Spec.Mutations), len(want.Mutating.Spec.Mutations))
	}
	vb := get(t, c, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}, name)
	if vb.Spec.PolicyName != name || !slices.Equal(vb.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}) {
		t.Errorf("ValidatingAdmissionPolicyBinding spec %+v", vb.Spec)
	}
	mb := get(t, c, &admissionregistrationv1.MutatingAdmissionPolicyBinding{}, name)
	if mb.Spec.PolicyName != name {
		t.Errorf("MutatingAdmissionPolicyBinding names policy %q", mb.Spec.PolicyName)
	}
	// The configured namespaces, the system ones and the policy's exempt
	// ones are left out of both bindings.
	wantExcluded := []string{"batch-tools", "gpu-operator", "gpuguard", "kube-node-lease", "kube-system"}
	if got := excluded(vb.Spec.MatchResources); !slices.Equal(got, wantExcluded) {
		t.Errorf("validating binding excludes %v, want %v", got, wantExcluded)
	}
	if got := excluded(mb.Spec.MatchResources); !slices.Equal(got, wantExcluded) {
		t.Errorf("mutating binding excludes %v, want %v", got, wantExcluded)
	}
	for _, obj := range []client.Object{vap, mp, vb, mb} {
		if refs := obj.GetOwnerReferences(); len(refs) != 0 {
			t.Errorf("%T has owner references %v without an owner named", obj, refs)
		}
		if !managedBy(obj, wellknown.BackstopFieldManager) {
			t.Errorf("%T not applied by field manager %s: %+v", obj, wellknown.BackstopFieldManager, obj.GetManagedFields())
		}
	}
	// The integration is off: no KAI guard.
	absent(t, c, &admissionregistrationv1.ValidatingAdmissionPolicy{}, cel.KAIGuardName(name))
	if got := testutil.ToFloat64(s.Syncs.WithLabelValues("success")); got != 1 {
		t.Errorf("success syncs %v, want 1", got)
	}
}

func TestApplyFollowsThePolicy(t *testing.T) {
	s, c := newSync(t, nil)
	ctx := context.Background()
	p := config.Default()
	if err := s.Apply(ctx, p); err != nil {
		t.Fatal(err)
	}

	// A policy edit reaches the objects in place.
	p.Spec.Mode = config.ModeWarn
	p.Spec.Exemptions.Namespaces = []string{"research"}
	if err := s.Apply(ctx, p); err != nil {
		t.Fatal(err)
	}
	vb := get(t, c, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}, name)
	if !slices.Contains(vb.Spec.ValidationActions, admissionregistrationv1.Warn) || slices.Contains(vb.Spec.ValidationActions, admissionregistrationv1.Deny) {
		t.Errorf("after mode: warn the binding's actions are %v", vb.Spec.ValidationActions)
	}
	if !slices.Contains(excluded(vb.Spec.MatchResources), "research") {
		t.Errorf("a newly exempt namespace is still bound: %v", excluded(vb.Spec.MatchResources))
	}

	// An edit by hand is undone by the next apply.
	vap := get(t, c, &admissionregistrationv1.ValidatingAdmissionPolicy{}, name)
	rendered := vap.Spec.Validations
	vap.Spec.Validations = []admissionregistrationv1.Validation{{Expression: "true"}}
	vap.ManagedFields = nil
	if err := c.Update(ctx, vap); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(ctx, p); err != nil {
		t.Fatal(err)
	}
	vap = get(t, c, &admissionregistrationv1.ValidatingAdmissionPolicy{}, name)
	if len(vap.Spec.Validations) != len(rendered) || vap.Spec.Validations[0].Expression != rendered[0].Expression {
		t.Errorf("a validation edited by hand survived the reapply: %+v", vap.Spec.Validations[0])
	}

	// So is a deletion.
	if err := c.Delete(ctx, &admissionregistrationv1.MutatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(ctx, p); err != nil {
		t.Fatal(err)
	}
	get(t, c, &admissionregistrationv1.MutatingAdmissionPolicyBinding{}, name)
}

func TestApplyOwner(t *testing.T) {
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "gpuguard-webhook", UID: types.UID("role-uid")}}
	s, c := newSync(t, nil, role)
	s.Owner = role.Name
	if err := s.Apply(context.Background(), config.Default()); err != nil {
		t.Fatal(err)
	}
	for _, obj := range []client.Object{
		&admissionregistrationv1.ValidatingAdmissionPolicy{}, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{},
		&admissionregistrationv1.MutatingAdmissionPolicy{}, &admissionregistrationv1.MutatingAdmissionPolicyBinding{},
	} {
		refs := get(t, c, obj, name).GetOwnerReferences()
		if len(refs) != 1 || refs[0].Kind != "ClusterRole" || refs[0].APIVersion != "rbac.authorization.k8s.io/v1" ||
			refs[0].Name != role.Name || refs[0].UID != role.UID {
			t.Errorf("%T owner references %+v, want the ClusterRole %s", obj, refs, role.Name)
		}
	}
}

func TestApplyMissingOwnerAppliesNothing(t *testing.T) {
	s, c := newSync(t, nil)
	s.Owner = "gpuguard-webhook"
	err := s.Apply(context.Background(), config.Default())
	if !apierrors.IsNotFound(errors.Unwrap(err)) {
		t.Fatalf("want the owner's not found error, got %v", err)
	}
	// Without its owner the backstop would never be collected: nothing lands.
	absent(t, c, &admissionregistrationv1.ValidatingAdmissionPolicy{}, name)
	if got := testutil.ToFloat64(s.Syncs.WithLabelValues("error")); got != 1 {
		t.Errorf("error syncs %v, want 1", got)
	}
}

func TestApplyUnrenderablePolicyKeepsTheObjects(t *testing.T) {
	s, c := newSync(t, nil)
	ctx := context.Background()
	if err := s.Apply(ctx, config.Default()); err != nil {
		t.Fatal(err)
	}
	before := get(t, c, &admissionregistrationv1.ValidatingAdmissionPolicy{}, name)
	p := config.Default()
	p.Spec.Mode = config.ModeAudit
	p.Spec.GPUResources = []string{"nvidia.com/gpu-[ab]"}
	if err := s.Apply(ctx, p); err == nil {
		t.Fatal("a policy with a character class in gpuResources applied")
	}
	after := get(t, c, &admissionregistrationv1.ValidatingAdmissionPolicy{}, name)
	if after.ResourceVersion != before.ResourceVersion {
		t.Error("a policy that does not render changed the backstop")
	}
	vb := get(t, c, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}, name)
	if !slices.Equal(vb.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}) {
		t.Errorf("binding actions %v after a failed apply", vb.Spec.ValidationActions)
	}
	if got := testutil.ToFloat64(s.Syncs.WithLabelValues("error")); got != 1 {
		t.Errorf("error syncs %v, want 1", got)
	}
}

func TestApplyKAIGuard(t *testing.T) {
	d := &deletes{}
	s, c := newSync(t, d)
	ctx := context.Background()
	guard := cel.KAIGuardName(name)

	on := config.Default()
	on.Spec.Integrations.KAIScheduler = config.KAIScheduler{Fractions: true, SchedulerNames: []string{"kai-scheduler"},
		BinderServiceAccounts: []string{"system:serviceaccount:kai-scheduler:binder"}}
	if err := s.Apply(ctx, on); err != nil {
		t.Fatal(err)
	}
	get(t, c, &admissionregistrationv1.ValidatingAdmissionPolicy{}, guard)
	get(t, c, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}, guard)
	if d.n != 0 {
		t.Errorf("%d deletes while the integration is on", d.n)
	}

	// Turning the integration off removes the stale guard, once.
	if err := s.Apply(ctx, config.Default()); err != nil {
		t.Fatal(err)
	}
	absent(t, c, &admissionregistrationv1.ValidatingAdmissionPolicy{}, guard)
	absent(t, c, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}, guard)
	get(t, c, &admissionregistrationv1.ValidatingAdmissionPolicy{}, name)
	deleted := d.n
	if deleted != 2 {
		t.Errorf("%d deletes removing the guard, want 2", deleted)
	}
	if err := s.Apply(ctx, config.Default()); err != nil {
		t.Fatal(err)
	}
	if d.n != deleted {
		t.Errorf("a reapply without the integration deleted again (%d deletes)", d.n-deleted)
	}

	// On again: the guard comes back, and goes again when it is turned off.
	if err := s.Apply(ctx, on); err != nil {
		t.Fatal(err)
	}
	get(t, c, &admissionregistrationv1.ValidatingAdmissionPolicy{}, guard)
	if err := s.Apply(ctx, config.Default()); err != nil {
		t.Fatal(err)
	}
	absent(t, c, &admissionregistrationv1.ValidatingAdmissionPolicy{}, guard)
}

func TestApplyGuardLeftBeforeARestart(t *testing.T) {
	// A new process finds the guard a previous one applied and removes it
	// on its first apply, without the integration; a missing guard is fine.
	guard := cel.KAIGuardName(name)
	s, c := newSync(t, nil,
		&admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: guard}})
	if err := s.Apply(context.Background(), config.Default()); err != nil {
		t.Fatal(err)
	}
	absent(t, c, &admissionregistrationv1.ValidatingAdmissionPolicy{}, guard)
}

func TestApplyKAIGuardOnly(t *testing.T) {
	s, c := newSync(t, nil)
	s.Options.KAIGuardOnly = true
	on := config.Default()
	on.Spec.Integrations.KAIScheduler = config.KAIScheduler{Fractions: true, SchedulerNames: []string{"kai-scheduler"},
		BinderServiceAccounts: []string{"system:serviceaccount:kai-scheduler:binder"}}
	if err := s.Apply(context.Background(), on); err != nil {
		t.Fatal(err)
	}
	get(t, c, &admissionregistrationv1.ValidatingAdmissionPolicy{}, cel.KAIGuardName(name))
	absent(t, c, &admissionregistrationv1.ValidatingAdmissionPolicy{}, name)
	absent(t, c, &admissionregistrationv1.MutatingAdmissionPolicy{}, name)
}
