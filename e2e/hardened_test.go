//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuguard/gpuguard/e2e/framework"
	"github.com/gpuguard/gpuguard/e2e/framework/controlplane"
	"github.com/gpuguard/gpuguard/internal/wellknown"
)

// gpuNodeLabel marks this test's Nodes as GPU nodes (the suite's control
// plane has no kubelet; the Nodes are API objects, as the agents' reports
// are labels on them).
const gpuNodeLabel = "e2e.gpuguard.io/gpu"

// TestHardenedProfileFollowsTheNodes runs the webhook, and its backstop,
// with --inject-void=auto as the only gpuguard the API server calls. While
// every GPU node reports gpuguard.io/hardened=true, a plain pod is stored
// without void; a violating pod is still denied; when one GPU node stops
// reporting it, void is injected again, by the webhook and by the backstop.
func TestHardenedProfileFollowsTheNodes(t *testing.T) {
	ctx := context.Background()
	const name = "gpuguard-hardened"
	nodes := []string{"gpu-hardened-a", "gpu-hardened-b"}
	hardenOtherGPUNodes(t, nodes...)
	for _, n := range nodes {
		setNodeLabels(t, n, map[string]string{gpuNodeLabel: "true", wellknown.HardenedMarkLabel: "true"})
	}
	wh := startClusterWebhook(t, "gpuguard-hardened", "--cel-backstop", "--cel-backstop-name", name,
		"--cel-backstop-exclude-namespace", releaseNS, "--validating-webhook-configuration", s.Configs.Validating.Name,
		"--inject-void=auto", "--gpu-node-label", gpuNodeLabel+"=true")
	if err := wh.WaitReady(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	callOnly(t, wh, func() {
		removeBackstop(ctx, t, name)
		for _, n := range nodes {
			_ = s.cp.Client.CoreV1().Nodes().Delete(ctx, n, metav1.DeleteOptions{})
		}
	})
	waitVoid(t, wh, false)
	if _, err := s.cp.Client.CoreV1().Pods(enforceNS).Create(ctx, withEnv(plainPod("miner"), allGPUs),
		metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err == nil {
		t.Error("with the injection off, a pod with NVIDIA_VISIBLE_DEVICES=all must still be denied")
	}
	setNodeLabels(t, nodes[1], map[string]string{wellknown.HardenedMarkLabel: "false"})
	waitVoid(t, wh, true)
	// The backstop alone follows too: with the webhooks gone, its
	// MutatingAdmissionPolicy injects again.
	if err := s.Configs.Remove(ctx, s.cp.Client); err != nil {
		t.Fatal(err)
	}
	waitVoid(t, wh, true)
}

// waitVoid waits until a plain pod is stored with void (want) or without,
// and the webhook's gauge says the same.
func waitVoid(t *testing.T, wh *controlplane.Webhook, want bool) {
	t.Helper()
	ctx := context.Background()
	var last string
	err := framework.Poll(ctx, time.Minute, func() (bool, error) {
		p, err := s.cp.Client.CoreV1().Pods(enforceNS).Create(ctx, plainPod("notebook"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		m, err := wh.Metrics(ctx)
		if err != nil {
			return false, err
		}
		voided := lastEnv(p.Spec.Containers[0], "NVIDIA_VISIBLE_DEVICES") == "void"
		last = fmt.Sprintf("env %v, gpuguard_void_injection_off %v", p.Spec.Containers[0].Env, m["gpuguard_void_injection_off"])
		return voided == want && (m["gpuguard_void_injection_off"] == 1) != want, nil
	})
	if err != nil {
		t.Fatalf("want a plain pod stored with void=%v: %v (last: %s)\n%s", want, err, last, framework.Tail(wh.Log))
	}
}

// setNodeLabels creates the Node, or merges labels into it.
func setNodeLabels(t *testing.T, name string, labels map[string]string) {
	t.Helper()
	ctx := context.Background()
	nodes := s.cp.Client.CoreV1().Nodes()
	_, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	if err == nil {
		return
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nodes.Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestEnforcedProfileFollowsTheLeases: with --enforcer-lease-namespace, a
// GPU node that is not hardened counts as covered while its node enforcer
// holds a fresh Lease, so a plain pod is stored without void; when the
// Lease goes stale, with no event to say so, void is injected again. The
// hardened nodes beside it hold their agents' Leases.
func TestEnforcedProfileFollowsTheLeases(t *testing.T) {
	hardened, enforced := "gpu-lease-hardened", "gpu-lease-enforced"
	others := hardenOtherGPUNodes(t, hardened, enforced)
	setNodeLabels(t, hardened, map[string]string{gpuNodeLabel: "true", wellknown.HardenedMarkLabel: "true"})
	setNodeLabels(t, enforced, map[string]string{gpuNodeLabel: "true"})
	keepLeases(t, wellknown.AgentLeasePrefix, append(others, hardened)...)
	holdLeases(t, wellknown.EnforcerLeasePrefix, 15, enforced)
	wh := startLeaseWebhook(t, hardened, enforced)
	waitVoid(t, wh, false)
	// Not renewed, the Lease goes stale after its 15 s: the webhook looks
	// again on its own.
	waitVoid(t, wh, true)
}

// TestForgedLeaseDurationIsCapped: whoever writes a coverage Lease sets
// its duration. The webhook counts none for longer than the agents' own
// (wellknown.CoverageLeaseSeconds) after its renewal: a Lease renewed two
// minutes ago that claims to last 68 years covers nothing. Without the cap
// it switches void off for its node.
func TestForgedLeaseDurationIsCapped(t *testing.T) {
	forged := "gpu-lease-forged"
	others := hardenOtherGPUNodes(t, forged)
	setNodeLabels(t, forged, map[string]string{gpuNodeLabel: "true"})
	keepLeases(t, wellknown.AgentLeasePrefix, others...)
	l := holdLeases(t, wellknown.EnforcerLeasePrefix, 2147483647, forged)[0]
	l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now().Add(-2 * time.Minute)}
	if _, err := s.cp.Client.CoordinationV1().Leases(releaseNS).Update(context.Background(), l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wh := startLeaseWebhook(t, forged)
	// The other nodes are covered (void off without the forged node is
	// what the control below shows), the forged one is not.
	waitVoid(t, wh, true)
	setNodeLabels(t, forged, map[string]string{wellknown.HardenedMarkLabel: "true"})
	holdLeases(t, wellknown.AgentLeasePrefix, wellknown.CoverageLeaseSeconds, forged)
	waitVoid(t, wh, false)
}

// TestHardenedMarkFollowsTheAgentsLease: where the webhook follows Leases,
// a node's hardened mark counts only while its agent holds a fresh Lease:
// once the agent stops renewing it (it died, and the node may have been
// reconfigured since), void is injected again, though the mark stays.
func TestHardenedMarkFollowsTheAgentsLease(t *testing.T) {
	hardened := "gpu-agent-lease"
	others := hardenOtherGPUNodes(t, hardened)
	setNodeLabels(t, hardened, map[string]string{gpuNodeLabel: "true", wellknown.HardenedMarkLabel: "true"})
	keepLeases(t, wellknown.AgentLeasePrefix, others...)
	holdLeases(t, wellknown.AgentLeasePrefix, 15, hardened)
	wh := startLeaseWebhook(t, hardened)
	waitVoid(t, wh, false)
	waitVoid(t, wh, true)
}

// TestStaleNodeViewFallsBackToInjection: the hardened profile rests on the
// agents' Leases as the webhook last saw them. Cut off from the API server
// (which still calls it), the webhook sees no renewal, so it puts the void
// injection back when the Lease it rests on would go stale, and admits
// every pod meanwhile; when its watch resumes and it sees the renewed
// Lease, the injection is off again.
func TestStaleNodeViewFallsBackToInjection(t *testing.T) {
	ctx := context.Background()
	const leaseSeconds = 10
	hardened := "gpu-stale-view"
	others := hardenOtherGPUNodes(t, hardened)
	setNodeLabels(t, hardened, map[string]string{gpuNodeLabel: "true", wellknown.HardenedMarkLabel: "true"})
	keepLeases(t, wellknown.AgentLeasePrefix, others...)
	renewLease(t, holdLeases(t, wellknown.AgentLeasePrefix, leaseSeconds, hardened)[0])

	u, err := url.Parse(s.cp.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := controlplane.StartAPIProxy(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	direct, err := s.cp.Kubeconfig("gpuguard-stale-view")
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := proxy.Kubeconfig(direct)
	if err != nil {
		t.Fatal(err)
	}
	wh := startLeaseWebhookWith(t, kubeconfig, hardened)
	waitVoid(t, wh, false)

	proxy.Cut()
	cut := time.Now()
	// The last renewal the webhook saw is at most leaseSeconds old when
	// it goes stale; a read of the hardening follows within a second.
	err = framework.Poll(ctx, (leaseSeconds+3)*time.Second, func() (bool, error) {
		p, err := s.cp.Client.CoreV1().Pods(enforceNS).Create(ctx, plainPod("notebook"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return false, fmt.Errorf("a plain pod failed admission while the webhook was cut off: %w", err)
		}
		return lastEnv(p.Spec.Containers[0], "NVIDIA_VISIBLE_DEVICES") == "void", nil
	})
	if err != nil {
		t.Fatalf("cut off from the API server, the webhook did not put void back within the Lease's %ds: %v\n%s", leaseSeconds, err, framework.Tail(wh.Log))
	}
	t.Logf("void back %s after the cut (Lease of %ds renewed every 2s)", time.Since(cut).Round(100*time.Millisecond), leaseSeconds)

	proxy.Resume()
	waitVoid(t, wh, false)
}

// renewLease renews l every 2 seconds until the test ends, as a running
// agent does.
func renewLease(t *testing.T, l *coordinationv1.Lease) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		tick := time.NewTicker(2 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if err := controlplane.RenewLease(ctx, s.cp.Client, l.Namespace, l.Name); err != nil && ctx.Err() == nil {
				t.Errorf("renewing Lease %s: %v", l.Name, err)
				return
			}
		}
	}()
}

// startLeaseWebhook starts a webhook with injectVoid auto following the
// release namespace's Leases, the only gpuguard the API server calls until
// the test ends; then nodes are deleted.
func startLeaseWebhook(t *testing.T, nodes ...string) *controlplane.Webhook {
	t.Helper()
	kubeconfig, err := s.cp.Kubeconfig("gpuguard-leases")
	if err != nil {
		t.Fatal(err)
	}
	return startLeaseWebhookWith(t, kubeconfig, nodes...)
}

// startLeaseWebhookWith is startLeaseWebhook with the webhook's kubeconfig.
func startLeaseWebhookWith(t *testing.T, kubeconfig string, nodes ...string) *controlplane.Webhook {
	t.Helper()
	ctx := context.Background()
	wh := startWebhookWith(t, kubeconfig, policyName, "--inject-void=auto", "--gpu-node-label", gpuNodeLabel+"=true",
		"--enforcer-lease-namespace", releaseNS)
	if err := wh.WaitReady(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	callOnly(t, wh, func() {
		for _, n := range nodes {
			_ = s.cp.Client.CoreV1().Nodes().Delete(ctx, n, metav1.DeleteOptions{})
		}
	})
	return wh
}

// callOnly points the suite's webhook configurations at wh, the only
// gpuguard the API server calls, until the test ends: then wh stops,
// cleanup runs and the suite's webhook is put back and enforcing.
func callOnly(t *testing.T, wh *controlplane.Webhook, cleanup func()) {
	t.Helper()
	ctx := context.Background()
	s.Configs.PointAt(wh.Port, s.CA.PEM)
	t.Cleanup(func() {
		_ = wh.Stop()
		cleanup()
		s.Configs.PointAt(s.Webhook.Port, s.CA.PEM)
		if err := s.Configs.Install(ctx, s.cp.Client); err != nil {
			t.Error(err)
		}
		if err := s.waitEnforcing(ctx); err != nil {
			t.Error(err)
		}
	})
	if err := s.Configs.Install(ctx, s.cp.Client); err != nil {
		t.Fatal(err)
	}
}

// hardenOtherGPUNodes marks every GPU node other tests left in the suite's
// API server (the fixtures' nodes advertise GPUs in their allocatable, and
// count as GPU nodes without a label) hardened until the test ends, so
// that only the test's own nodes decide; the mark is removed after. It
// returns those nodes.
func hardenOtherGPUNodes(t *testing.T, own ...string) []string {
	t.Helper()
	ctx := context.Background()
	list, err := s.cp.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var others []string
	for _, n := range list.Items {
		if slices.Contains(own, n.Name) {
			continue
		}
		gpu := n.Labels[gpuNodeLabel] == "true"
		for name, q := range n.Status.Allocatable {
			gpu = gpu || (strings.HasPrefix(string(name), "nvidia.com/") && q.Sign() > 0)
		}
		if !gpu {
			continue
		}
		others = append(others, n.Name)
		if n.Labels[wellknown.HardenedMarkLabel] == "true" {
			continue
		}
		setNodeLabels(t, n.Name, map[string]string{wellknown.HardenedMarkLabel: "true"})
		t.Cleanup(func() {
			patch := []byte(`{"metadata":{"labels":{"` + wellknown.HardenedMarkLabel + `":null}}}`)
			_, _ = s.cp.Client.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		})
	}
	return others
}

// keepLeases holds a Lease of prefix for each node and renews it until the
// test ends, as running agents do: the webhook counts none for longer than
// wellknown.CoverageLeaseSeconds after a renewal, whatever it claims.
func keepLeases(t *testing.T, prefix string, nodes ...string) {
	t.Helper()
	for _, l := range holdLeases(t, prefix, wellknown.CoverageLeaseSeconds, nodes...) {
		renewLease(t, l)
	}
}

// holdLeases creates, until the test ends, a fresh Lease of prefix for each
// node, held by it for seconds, in the release namespace, as the agents
// hold theirs; it returns them.
func holdLeases(t *testing.T, prefix string, seconds int32, nodes ...string) []*coordinationv1.Lease {
	t.Helper()
	ctx := context.Background()
	leases := s.cp.Client.CoordinationV1().Leases(releaseNS)
	var out []*coordinationv1.Lease
	for _, n := range nodes {
		holder, renewed := n, metav1.NewMicroTime(time.Now())
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: prefix + n},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &seconds, RenewTime: &renewed}}
		l, err := leases.Create(ctx, l, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = leases.Delete(ctx, l.Name, metav1.DeleteOptions{}) })
		out = append(out, l)
	}
	return out
}
