//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"hash/crc32"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpuguard/gpuguard/e2e/framework"
	"github.com/gpuguard/gpuguard/e2e/framework/controlplane"
	"github.com/gpuguard/gpuguard/internal/manifest"
)

// requester is the user the request fixtures are sent as: a tenant granted
// exactly the pod subresources they use, as a custom controller or scheduler
// would be.
const requester = "fixture-requester"

// requestFixtures loads the engine's fixtures that are requests on an existing
// pod under the default policy: an UPDATE of the pod, of its status or of its
// ephemeral containers, and a Binding.
func requestFixtures(t *testing.T) []namedFixture {
	return loadFixtures(t, "request", isRequestFixture, 5)
}

// isRequestFixture: a request on an existing pod, under the default policy.
func isRequestFixture(f *fixture) bool {
	defaultPolicy := f.Phase == "" && len(f.Policy) == 0 && f.Username == "" && len(f.NamespaceLabels) == 0 && f.Namespace == ""
	switch {
	case !defaultPolicy:
		return false
	case f.Operation == "UPDATE":
		return slices.Contains([]string{"", "status", "ephemeralcontainers"}, f.SubResource) && strings.Contains(string(f.Object), `"kind":"Pod"`)
	case f.SubResource == "binding":
		return true
	}
	return false
}

// TestRequestFixtures sends every request fixture through the real API server,
// as a tenant allowed exactly those requests: the pod it acts on is created
// first, then the fixture's change is sent (annotations and status through the
// pod or its status, ephemeral containers through their subresource, a
// Binding through pods/binding). Fail fixtures must be denied naming exactly
// their rules; pass fixtures must be admitted. A pod that gpuguard would
// refuse stands for one from before its install, and is created so.
func TestRequestFixtures(t *testing.T) {
	ctx := context.Background()
	tenant := requesterClient(t)
	fixtures := requestFixtures(t)
	targets := make([]*corev1.Pod, len(fixtures))
	var early []int
	for i, f := range fixtures {
		pod, err := createTarget(ctx, tenant, f)
		switch {
		case err == nil:
			targets[i] = pod
		case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "gpuguard denied"):
			early = append(early, i)
		default:
			t.Fatalf("%s: creating the pod it acts on: %v", f.name, err)
		}
	}
	if len(early) > 0 {
		createBeforeInstall(t, func() bool {
			for _, i := range early {
				if targets[i] == nil {
					pod, err := createTarget(ctx, s.cp.Client, fixtures[i])
					if err != nil {
						return false
					}
					targets[i] = pod
				}
			}
			return true
		})
	}
	for i, f := range fixtures {
		t.Run(f.name, func(t *testing.T) {
			err := sendRequest(ctx, tenant, f.fixture, targets[i])
			if !strings.HasPrefix(f.name, "fail/") {
				if err != nil {
					t.Fatalf("a pass fixture was refused: %v", err)
				}
				return
			}
			if got, want := deniedRules(t, err), expectedRules(f.fixture); !slices.Equal(got, want) {
				t.Errorf("the API server denied with rules %v, the fixture expects %v", got, want)
			}
		})
	}
}

// createBeforeInstall removes gpuguard's webhooks, retries create until it
// succeeds (the API server drops removed webhooks a moment later), and puts
// the webhooks back.
func createBeforeInstall(t *testing.T, create func() bool) {
	ctx := context.Background()
	if err := s.Configs.Remove(ctx, s.cp.Client); err != nil {
		t.Fatal(err)
	}
	err := framework.Poll(ctx, webhookTimeout, func() (bool, error) { return create(), nil })
	if err := s.Configs.Install(ctx, s.cp.Client); err != nil {
		t.Fatal(err)
	}
	if err2 := s.waitEnforcing(ctx); err2 != nil {
		t.Fatal(err2)
	}
	if err != nil {
		t.Fatalf("creating pods without gpuguard: %v", err)
	}
}

// requesterClient is a client acting as the requester, who may create pods
// and update them, their status and ephemeral containers, and bind them.
func requesterClient(t *testing.T) kubernetes.Interface {
	t.Helper()
	ctx := context.Background()
	rbac := s.cp.Client.RbacV1()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: requester}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "create", "update", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"pods/status", "pods/ephemeralcontainers"}, Verbs: []string{"update", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"pods/binding", "bindings"}, Verbs: []string{"create"}},
	}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: requester},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: requester},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: requester}}}
	if _, err := rbac.ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := rbac.ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(s.cp.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: requester}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// fixtureNamespace is a namespace of a fixture's own.
func fixtureNamespace(name string) string {
	return fmt.Sprintf("rq-%08x", crc32.ChecksumIEEE([]byte(name)))
}

// createTarget creates the pod a request fixture acts on: its old object, or
// for a Binding a plain pod of the bound name.
func createTarget(ctx context.Context, c kubernetes.Interface, f namedFixture) (*corev1.Pod, error) {
	ns := fixtureNamespace(f.name)
	if err := controlplane.EnsureNamespace(ctx, s.cp, ns, nil); err != nil {
		return nil, err
	}
	obj, err := manifest.DecodeObject(f.Object)
	if err != nil {
		return nil, err
	}
	pod := &corev1.Pod{}
	if b, ok := obj.(*corev1.Binding); ok {
		pod = withEnv(plainPod(b.Name), corev1.EnvVar{Name: "NVIDIA_VISIBLE_DEVICES", Value: "void"})
	} else {
		old, err := manifest.DecodeObject(f.OldObject)
		if err != nil {
			return nil, err
		}
		pod = old.(*corev1.Pod)
	}
	pod.Namespace = ns
	// Ephemeral containers cannot be set on create: they are added next,
	// through their subresource, as kubectl debug would have.
	ephemeral := pod.Spec.EphemeralContainers
	pod.Spec.EphemeralContainers = nil
	created, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil || len(ephemeral) == 0 {
		return created, err
	}
	created.Spec.EphemeralContainers = ephemeral
	return c.CoreV1().Pods(ns).UpdateEphemeralContainers(ctx, created.Name, created, metav1.UpdateOptions{})
}

// sendRequest sends a fixture's request about the pod target.
func sendRequest(ctx context.Context, tenant kubernetes.Interface, f *fixture, target *corev1.Pod) error {
	obj, err := manifest.DecodeObject(f.Object)
	if err != nil {
		return err
	}
	pods := tenant.CoreV1().Pods(target.Namespace)
	if b, ok := obj.(*corev1.Binding); ok {
		b.Namespace = target.Namespace
		return pods.Bind(ctx, b, metav1.CreateOptions{})
	}
	want := obj.(*corev1.Pod)
	upd := target.DeepCopy()
	switch f.SubResource {
	case "":
		upd.Annotations = want.Annotations
		_, err = pods.Update(ctx, upd, metav1.UpdateOptions{})
	case "status":
		upd.Annotations = want.Annotations
		upd.Status = want.Status
		_, err = pods.UpdateStatus(ctx, upd, metav1.UpdateOptions{})
	case "ephemeralcontainers":
		upd.Spec.EphemeralContainers = want.Spec.EphemeralContainers
		_, err = pods.UpdateEphemeralContainers(ctx, upd.Name, upd, metav1.UpdateOptions{})
	}
	return err
}

// TestBindingsSentOnlyWithAnnotations binds pods as the scheduler does, through
// pods/binding and through the older namespace-level bindings resource. A
// binding without annotations never reaches the webhook (the chart's match
// condition); one that carries a deny-listed annotation is denied on either
// path and counted, so a flat count is the filter at work.
func TestBindingsSentOnlyWithAnnotations(t *testing.T) {
	ctx := context.Background()
	tenant := requesterClient(t)
	ns := fixtureNamespace("bindings-sent-only-with-annotations")
	if err := controlplane.EnsureNamespace(ctx, s.cp, ns, nil); err != nil {
		t.Fatal(err)
	}
	pods := tenant.CoreV1().Pods(ns)
	for _, name := range []string{"plain", "legacy", "annotated"} {
		if _, err := pods.Create(ctx, plainPod(name), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	binding := func(pod string, annotations map[string]string) *corev1.Binding {
		return &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: ns, Annotations: annotations},
			Target: corev1.ObjectReference{Kind: "Node", Name: "gpu-node-1"}}
	}
	legacyBind := func(b *corev1.Binding) error {
		return tenant.CoreV1().RESTClient().Post().Namespace(ns).Resource("bindings").
			Body(b).Do(ctx).Error()
	}
	forged := map[string]string{"cdi.k8s.io/gpus": "nvidia.com/gpu=all"}

	before := bindingDecisions(t)
	if err := pods.Bind(ctx, binding("plain", nil), metav1.CreateOptions{}); err != nil {
		t.Fatalf("a binding without annotations was refused: %v", err)
	}
	if err := legacyBind(binding("legacy", nil)); err != nil {
		t.Fatalf("a binding without annotations, through the bindings resource, was refused: %v", err)
	}
	if after := bindingDecisions(t); after != before {
		t.Errorf("the webhook decided %v bindings without annotations, want none", after-before)
	}
	expectDenied(t, legacyBind(binding("annotated", forged)), "device-annotation")
	expectDenied(t, pods.Bind(ctx, binding("annotated", forged), metav1.CreateOptions{}), "device-annotation")
	if after := bindingDecisions(t); after < before+2 {
		t.Errorf("two bindings with a device annotation were not both counted (%v before, %v after)", before, after)
	}
	stored, err := pods.Get(ctx, "annotated", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if stored.Spec.NodeName != "" || stored.Annotations["cdi.k8s.io/gpus"] != "" {
		t.Errorf("a denied binding still reached the pod: node %q, annotations %v", stored.Spec.NodeName, stored.Annotations)
	}
}

// bindingDecisions sums the suite webhook's decisions on Bindings.
func bindingDecisions(t *testing.T) float64 {
	t.Helper()
	n, err := s.Webhook.Decisions(context.Background(), `kind="Binding"`)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
