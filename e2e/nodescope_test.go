//go:build e2e

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/gpuguard/gpuguard/e2e/framework"
	"github.com/gpuguard/gpuguard/e2e/framework/controlplane"
	"github.com/gpuguard/gpuguard/internal/wellknown"
)

// agentUser is the chart's agent service account in the golden renderings.
const agentUser = "system:serviceaccount:" + chartNamespace + ":gpuguard-agent"

// nodeNameExtra is where the API server records the node of the pod a
// service account token is bound to.
const nodeNameExtra = "authentication.kubernetes.io/node-name"

// TestAgentNodeScope: the chart's node-scope policy, on a real API server,
// keeps the agent's token to its own node. Each attack is first shown
// succeeding with the agent's RBAC alone (a dry run), then refused with
// the policy in force, while the agent's own writes still pass: labelling
// another node or a label not gpuguard's, deleting a pod on another node,
// an Event from another node, and any write from a token bound to no pod.
func TestAgentNodeScope(t *testing.T) {
	ctx := context.Background()
	admin := s.cp.Client
	for _, name := range []string{"node-a", "node-b"} {
		if err := ensureNode(ctx, corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
			t.Fatal(err)
		}
	}
	grantAgent(t, ctx)
	ns := "nodescope"
	if err := controlplane.EnsureNamespace(ctx, s.cp, ns, nil); err != nil {
		t.Fatal(err)
	}
	podOn := map[string]string{}
	for _, node := range []string{"node-a", "node-b"} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "on-" + node, Namespace: ns},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
		if _, err := admin.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		podOn[node] = p.Name
	}
	onA, unbound := agentClient(t, "node-a"), agentClient(t, "")
	dry := metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}
	label := func(c kubernetes.Interface, node, key string) error {
		_, err := c.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(`{"metadata":{"labels":{"`+key+`":"true"}}}`), dry)
		return err
	}
	deletePod := func(c kubernetes.Interface, node string) error {
		return c.CoreV1().Pods(ns).Delete(ctx, podOn[node], metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
	}
	event := func(c kubernetes.Interface, host string) error {
		ev := &corev1.Event{ObjectMeta: metav1.ObjectMeta{GenerateName: "finding.", Namespace: ns},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: podOn["node-a"]},
			Reason:         "UnallocatedGPUAccess", Message: "m", Type: corev1.EventTypeWarning, Source: corev1.EventSource{Component: "gpuguard-agent", Host: host}}
		_, err := c.CoreV1().Events(ns).Create(ctx, ev, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	if err := controlplane.EnsureNamespace(ctx, s.cp, chartNamespace, nil); err != nil {
		t.Fatal(err)
	}
	namedLease := func(c kubernetes.Interface, prefix, node, holder string) error {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: prefix + node, Namespace: chartNamespace},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder}}
		_, err := c.CoordinationV1().Leases(chartNamespace).Create(ctx, l, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	lease := func(c kubernetes.Interface, node, holder string) error {
		return namedLease(c, wellknown.EnforcerLeasePrefix, node, holder)
	}
	attacks := map[string]func() error{
		"hold another node's agent Lease":     func() error { return namedLease(onA, wellknown.AgentLeasePrefix, "node-b", "node-b") },
		"a Lease of another name":             func() error { return namedLease(onA, "kube-scheduler-", "node-a", "node-a") },
		"hold another node's enforcer Lease":  func() error { return lease(onA, "node-b", "node-b") },
		"its enforcer Lease held by another":  func() error { return lease(onA, "node-a", "node-b") },
		"label another node":                  func() error { return label(onA, "node-b", "gpuguard.io/hardened") },
		"a label not gpuguard's, on its node": func() error { return label(onA, "node-a", "node-role.kubernetes.io/control-plane") },
		"delete a pod on another node":        func() error { return deletePod(onA, "node-b") },
		"an Event from another node":          func() error { return event(onA, "node-b") },
		"a token bound to no pod":             func() error { return label(unbound, "node-a", "gpuguard.io/hardened") },
	}
	own := map[string]func() error{
		"its own node's gpuguard labels": func() error { return label(onA, "node-a", "gpuguard.io/hardened") },
		"delete a pod on its node":       func() error { return deletePod(onA, "node-a") },
		"an Event from its node":         func() error { return event(onA, "node-a") },
		"its own enforcer Lease":         func() error { return lease(onA, "node-a", "node-a") },
		"its own agent Lease":            func() error { return namedLease(onA, wellknown.AgentLeasePrefix, "node-a", "node-a") },
	}
	for name, attack := range attacks {
		if err := attack(); err != nil {
			t.Fatalf("with RBAC alone, %s is refused (%v): the test shows nothing", name, err)
		}
	}
	installNodeScope(t, ctx)
	// The policy is in force once the API server refuses the first attack.
	if err := framework.Poll(ctx, time.Minute, func() (bool, error) {
		err := attacks["label another node"]()
		return err != nil && strings.Contains(err.Error(), "own node"), nil
	}); err != nil {
		t.Fatalf("the node-scope policy did not take effect: %v", err)
	}
	for name, attack := range attacks {
		if err := attack(); !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) {
			t.Errorf("%s: %v, want refused by the node-scope policy", name, err)
		}
	}
	for name, write := range own {
		if err := write(); err != nil {
			t.Errorf("%s: refused (%v), want allowed", name, err)
		}
	}
}

// agentClient acts as the chart's agent whose token is bound to a pod on
// node ("" for a token bound to no pod), through impersonation.
func agentClient(t *testing.T, node string) kubernetes.Interface {
	t.Helper()
	cfg := rest.CopyConfig(s.cp.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: agentUser,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + chartNamespace, "system:authenticated"}}
	if node != "" {
		cfg.Impersonate.Extra = map[string][]string{nodeNameExtra: {node}}
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// grantAgent binds the agent's grants with labels published and the
// verifier enforcing (nodes get and patch, pods delete, events create),
// which RBAC cannot narrow to a node, until the test ends.
func grantAgent(t *testing.T, ctx context.Context) {
	t.Helper()
	rbac := s.cp.Client.RbacV1()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "nodescope-agent"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update"}},
	}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "nodescope-agent"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: chartNamespace, Name: "gpuguard-agent"}}}
	t.Cleanup(func() {
		_ = rbac.ClusterRoleBindings().Delete(ctx, binding.Name, metav1.DeleteOptions{})
		_ = rbac.ClusterRoles().Delete(ctx, role.Name, metav1.DeleteOptions{})
	})
	if _, err := rbac.ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := rbac.ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// RBAC takes effect through the authorizer's informers: wait for it.
	if err := framework.Poll(ctx, time.Minute, func() (bool, error) {
		_, err := agentClient(t, "node-a").CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		t.Fatalf("the agent's grants did not take effect: %v", err)
	}
}

// installNodeScope creates the node-scope policy and binding of the chart's
// default rendering, until the test ends.
func installNodeScope(t *testing.T, ctx context.Context) {
	t.Helper()
	installChartPolicy(t, ctx, "default.yaml", "gpuguard-agent-node-scope")
}

// installChartPolicy creates the ValidatingAdmissionPolicy name and its
// binding as the chart's golden rendering golden holds them, until the test
// ends.
func installChartPolicy(t *testing.T, ctx context.Context, golden, name string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "charts", "testdata", golden))
	if err != nil {
		t.Fatal(err)
	}
	var policy *admissionregistrationv1.ValidatingAdmissionPolicy
	var binding *admissionregistrationv1.ValidatingAdmissionPolicyBinding
	for _, doc := range strings.Split(string(data), "\n---\n") {
		switch {
		case strings.Contains(doc, "kind: ValidatingAdmissionPolicy\n") && strings.Contains(doc, "\n  name: "+name+"\n"):
			policy = &admissionregistrationv1.ValidatingAdmissionPolicy{}
			err = sigsyaml.UnmarshalStrict([]byte(doc), policy)
		case strings.Contains(doc, "kind: ValidatingAdmissionPolicyBinding\n") && strings.Contains(doc, "\n  name: "+name+"\n"):
			binding = &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
			err = sigsyaml.UnmarshalStrict([]byte(doc), binding)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if policy == nil || binding == nil {
		t.Fatalf("the chart's rendering %s has no policy and binding %s", golden, name)
	}
	vap := s.cp.Client.AdmissionregistrationV1()
	t.Cleanup(func() {
		_ = vap.ValidatingAdmissionPolicyBindings().Delete(ctx, binding.Name, metav1.DeleteOptions{})
		_ = vap.ValidatingAdmissionPolicies().Delete(ctx, policy.Name, metav1.DeleteOptions{})
	})
	if _, err := vap.ValidatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := vap.ValidatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestCoverageLeasesOnlyTheirAgent: with admission.injectVoid=auto a fresh
// gpuguard-enforcer-<node> Lease switches void off for the node, and RBAC
// cannot keep anyone with Lease rights in the release namespace from
// creating one. The chart's coverage-leases policy, on a real API server,
// does: each forgery is first shown succeeding (a dry run), then refused,
// while the agent's own writes still pass. (Another node's Lease, which
// the node-scope policy refuses the agent too, is TestAgentNodeScope's.)
func TestCoverageLeasesOnlyTheirAgent(t *testing.T) {
	ctx := context.Background()
	grantAgent(t, ctx)
	if err := controlplane.EnsureNamespace(ctx, s.cp, chartNamespace, nil); err != nil {
		t.Fatal(err)
	}
	write := func(c kubernetes.Interface, prefix, node string, seconds int32) error {
		holder, renewed := node, metav1.NewMicroTime(time.Now())
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: prefix + node, Namespace: chartNamespace},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &seconds, RenewTime: &renewed}}
		_, err := c.CoordinationV1().Leases(chartNamespace).Create(ctx, l, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	onA, admin := agentClient(t, "node-a"), s.cp.Client
	attacks := map[string]func() error{
		"an admin's enforcer Lease for a node": func() error { return write(admin, wellknown.EnforcerLeasePrefix, "node-a", 60) },
		"an admin's agent Lease for a node":    func() error { return write(admin, wellknown.AgentLeasePrefix, "node-a", 60) },
		"the agent, a Lease lasting 68 years":  func() error { return write(onA, wellknown.EnforcerLeasePrefix, "node-a", 2147483647) },
		"the agent, one second past its own lasting": func() error {
			return write(onA, wellknown.AgentLeasePrefix, "node-a", wellknown.CoverageLeaseSeconds+1)
		},
	}
	own := map[string]func() error{
		"its own enforcer Lease": func() error {
			return write(onA, wellknown.EnforcerLeasePrefix, "node-a", wellknown.CoverageLeaseSeconds)
		},
		"its own agent Lease":              func() error { return write(onA, wellknown.AgentLeasePrefix, "node-a", wellknown.CoverageLeaseSeconds) },
		"an admin's Lease of another name": func() error { return write(admin, "gpuguard-audit-", "x", 3600) },
	}
	for name, attack := range attacks {
		if err := attack(); err != nil {
			t.Fatalf("without the policy, %s is refused (%v): the test shows nothing", name, err)
		}
	}
	// Registered before the policy's own cleanup, this runs after it: the
	// API server drops a deleted policy through its informers, and the
	// tests after this one write coverage Leases as the admin.
	t.Cleanup(func() {
		if err := framework.Poll(ctx, time.Minute, func() (bool, error) {
			return attacks["an admin's enforcer Lease for a node"]() == nil, nil
		}); err != nil {
			t.Errorf("the coverage-leases policy stayed in force after its deletion: %v", err)
		}
	})
	installChartPolicy(t, ctx, "node-enforcer.yaml", "gpuguard-agent-coverage-leases")
	if err := framework.Poll(ctx, time.Minute, func() (bool, error) {
		err := attacks["an admin's enforcer Lease for a node"]()
		return err != nil && strings.Contains(err.Error(), "coverage Leases"), nil
	}); err != nil {
		t.Fatalf("the coverage-leases policy did not take effect: %v", err)
	}
	for name, attack := range attacks {
		if err := attack(); !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) {
			t.Errorf("%s: %v, want refused by the coverage-leases policy", name, err)
		}
	}
	for name, w := range own {
		if err := w(); err != nil {
			t.Errorf("%s: refused (%v), want allowed", name, err)
		}
	}
}
