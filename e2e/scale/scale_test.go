//go:build e2e

package scale

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	openreports "github.com/openreports/reports-api/apis/openreports.io/v1alpha1"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/e2e/framework"
	"github.com/gpuguard/gpuguard/e2e/framework/controlplane"
	"github.com/gpuguard/gpuguard/internal/wellknown"
)

// The goals of docs/reliability.md at 1,000 nodes and 30,000 pods.
const (
	auditMemoryGoal   = 256 << 20
	webhookMemoryGoal = 128 << 20
)

// TestBackgroundAuditAtFleetSize builds the fleet (simulated GPU nodes,
// pods bound to them, created before gpuguard as on a cluster it is
// installed into), then runs the webhook with its background audit and
// OpenReports, and measures the audit: it must judge every pod, deny
// exactly the leaking ones and write one Report per namespace, within the
// chart's memory limit. Its duration, peak memory, API requests and
// Reports are logged as "scale:" lines for docs/reliability.md.
func TestBackgroundAuditAtFleetSize(t *testing.T) {
	ctx := context.Background()
	f := buildFleet(t, ctx)

	remove, err := controlplane.InstallOpenReportsCRDs(ctx, s.cp, s.root)
	t.Cleanup(remove)
	if err != nil {
		t.Fatal(err)
	}
	in, err := controlplane.Install(ctx, s.cp, s.root, "gpuguard", string(config.DefaultYAML()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Uninstall(ctx, s.cp) })
	// The same webhook, started again with the audit on (its first audit
	// begins once it has the policy) and the hardened-cluster profile, which
	// watches every Node and the agents' Leases: the caches that grow with
	// the fleet.
	if err := in.Webhook.Stop(); err != nil {
		t.Fatal(err)
	}
	in.Webhook.Extra = []string{"--audit-interval", "1h", "--audit-reports", "--inject-void=auto", "--enforcer-lease-namespace", "gpuguard"}
	start := time.Now()
	if err := in.StartWebhook(ctx); err != nil {
		t.Fatal(err)
	}
	var m map[string]float64
	err = framework.Poll(ctx, 15*time.Minute, func() (bool, error) {
		m, err = in.Webhook.Metrics(ctx)
		return err == nil && (m[`gpuguard_audit_runs_total{result="success"}`] >= 1 || m[`gpuguard_audit_runs_total{result="error"}`] >= 1), nil
	})
	if err != nil || m[`gpuguard_audit_runs_total{result="success"}`] < 1 {
		t.Fatalf("no successful background audit (%v)\n%s", err, framework.Tail(in.Webhook.Log))
	}
	sinceStart := time.Since(start)
	peak, err := in.Webhook.PeakRSS()
	if err != nil {
		t.Fatal(err)
	}

	// No node of the fleet is hardened: the profile keeps the injection on.
	if m["gpuguard_void_injection_off"] != 0 {
		t.Errorf("the hardened-cluster profile turned the void injection off on a fleet with no hardened node")
	}
	if got := int(m[`gpuguard_audit_objects{verdict="deny"}`]); got != f.leaking {
		t.Errorf("the audit denied %d pods, want the %d leaking ones", got, f.leaking)
	}
	judged := int(m[`gpuguard_audit_objects{verdict="deny"}`] + m[`gpuguard_audit_objects{verdict="warn"}`] + m[`gpuguard_audit_objects{verdict="allow"}`])
	if judged != f.pods {
		t.Errorf("the audit judged %d objects, want the fleet's %d pods", judged, f.pods)
	}
	reports, largest, total := listReports(t, ctx)
	if reports != f.namespaces {
		t.Errorf("%d Reports, want one per namespace (%d)", reports, f.namespaces)
	}
	if peak > auditMemoryGoal {
		t.Errorf("the webhook's peak RSS through the audit was %d MiB, over the chart's limit of %d MiB", peak>>20, auditMemoryGoal>>20)
	}
	requests := framework.SumMetrics(m, framework.MetricPrefix("rest_client_requests_total"))
	t.Logf("scale: fleet %d nodes, %d pods (%d leaking) in %d namespaces, built in %s",
		f.nodes, f.pods, f.leaking, f.namespaces, f.took.Round(time.Second))
	t.Logf("scale: audit %.1f s (%s from the webhook's start), peak RSS %d MiB (goal %d), %.0f API requests by the webhook, %d Reports (largest %d KiB, %d KiB in all)",
		m["gpuguard_audit_duration_seconds"], sinceStart.Round(time.Second), peak>>20, auditMemoryGoal>>20, requests, reports, largest>>10, total>>10)
	t.Logf("scale: the auditing webhook after the audit: RSS %d MiB, Go heap in use %d MiB",
		int64(m["process_resident_memory_bytes"])>>20, int64(m["go_memstats_heap_inuse_bytes"])>>20)
	replica := servingReplicaMemory(t, ctx, in)
	auditLeaseHandover(t, ctx, in, replica)
	agentHeartbeats(t, ctx, in, replica, f.nodes)
}

// auditLeaseHandover kills the auditing replica with SIGKILL: the serving
// one takes the audit Lease once it expires, and audits the fleet.
func auditLeaseHandover(t *testing.T, ctx context.Context, in *controlplane.Installation, replica *controlplane.Webhook) {
	t.Helper()
	leases := s.cp.Client.CoordinationV1().Leases(in.Namespace)
	before, err := leases.Get(ctx, wellknown.AuditLease, metav1.GetOptions{})
	if err != nil || before.Spec.HolderIdentity == nil || before.Spec.RenewTime == nil {
		t.Fatalf("no held audit Lease: %v", err)
	}
	if err := in.Webhook.Kill(); err != nil {
		t.Fatal(err)
	}
	var m map[string]float64
	err = framework.Poll(ctx, 5*time.Minute, func() (bool, error) {
		m, err = replica.Metrics(ctx)
		return err == nil && m[`gpuguard_audit_runs_total{result="success"}`] >= 1, nil
	})
	if err != nil {
		t.Fatalf("the serving replica did not take over the audit: %v\n%s", err, framework.Tail(replica.Log))
	}
	after, err := leases.Get(ctx, wellknown.AuditLease, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if *after.Spec.HolderIdentity == *before.Spec.HolderIdentity || after.Spec.AcquireTime == nil {
		t.Fatalf("the audit Lease is still held by %s", *after.Spec.HolderIdentity)
	}
	gap := after.Spec.AcquireTime.Sub(before.Spec.RenewTime.Time)
	t.Logf("scale: audit Lease handed over %s after the auditor's last renewal (lease duration %ds); the new auditor's audit %.1f s",
		gap.Round(time.Second), *after.Spec.LeaseDurationSeconds, m["gpuguard_audit_duration_seconds"])
}

// servingReplicaMemory starts a second replica as the chart runs them, with
// the same caches but not elected to audit (the first holds the Lease), and
// logs its memory once it serves: the steady memory of a replica at the
// fleet's size.
func servingReplicaMemory(t *testing.T, ctx context.Context, in *controlplane.Installation) *controlplane.Webhook {
	t.Helper()
	replica, err := controlplane.NewWebhook(in.Binary, in.Webhook.Kubeconfig, in.CertDir, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	replica.Env, replica.Extra = in.Webhook.Env, in.Webhook.Extra
	if err := replica.Start(in.Namespace + "/" + controlplane.PolicyConfigMap); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = replica.Stop() })
	if err := replica.WaitReady(ctx, 2*time.Minute); err != nil {
		t.Fatalf("%v\n%s", err, framework.Tail(replica.Log))
	}
	m, err := replica.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m[`gpuguard_audit_runs_total{result="success"}`] != 0 {
		t.Fatal("the second replica audited too: the audit Lease did not hold")
	}
	peak, err := replica.PeakRSS()
	if err != nil {
		t.Fatal(err)
	}
	rss := int64(m["process_resident_memory_bytes"])
	if rss > webhookMemoryGoal {
		t.Errorf("a serving replica holds %d MiB at this fleet's size, over the goal of %d MiB", rss>>20, webhookMemoryGoal>>20)
	}
	t.Logf("scale: a serving replica: RSS %d MiB (goal %d), peak %d MiB, Go heap in use %d MiB",
		rss>>20, webhookMemoryGoal>>20, peak>>20, int64(m["go_memstats_heap_inuse_bytes"])>>20)
	return replica
}

// fleet is what buildFleet made.
type fleet struct {
	nodes, pods, leaking, namespaces int
	took                             time.Duration
}

// buildFleet creates the simulated nodes and the pods bound to them, and
// waits until KWOK has every node Ready.
func buildFleet(t *testing.T, ctx context.Context) fleet {
	t.Helper()
	start := time.Now()
	f := fleet{nodes: *nodeCount, pods: *podCount, namespaces: *namespaceCount}
	c := s.cp.Client.CoreV1()
	run := func(n int, create func(i int) error) {
		t.Helper()
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(16)
		for i := range n {
			g.Go(func() error {
				if gctx.Err() != nil {
					return gctx.Err()
				}
				return create(i)
			})
		}
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	run(f.nodes, func(i int) error {
		n, err := c.Nodes().Create(ctx, simulatedNode(i), metav1.CreateOptions{})
		if err != nil {
			return err
		}
		n.Status = simulatedNode(i).Status
		_, err = c.Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err := s.kwok.WaitNodesReady(ctx, s.cp, f.nodes, 5*time.Minute); err != nil {
		t.Fatalf("KWOK did not make the nodes Ready: %v\n%s", err, framework.Tail(s.kwok.Log))
	}
	run(f.namespaces, func(i int) error {
		return controlplane.EnsureNamespace(ctx, s.cp, namespaceName(i), nil)
	})
	run(f.pods, func(i int) error {
		_, err := c.Pods(namespaceName(i%f.namespaces)).Create(ctx, fleetPod(i, f.nodes), metav1.CreateOptions{})
		return err
	})
	for i := range f.pods {
		if leaks(i) {
			f.leaking++
		}
	}
	f.took = time.Since(start)
	return f
}

func namespaceName(i int) string { return fmt.Sprintf("team-%03d", i) }

// simulatedNode is GPU node i of the fleet: most with 8 whole GPUs and GPU
// Feature Discovery's labels, every tenth with MIG devices, every tenth
// time-sliced, every fifth with only NFD's PCI label, every twentieth with
// no label at all (found by its allocatable alone).
func simulatedNode(i int) *corev1.Node {
	labels := map[string]string{"type": "kwok"}
	switch {
	case i%20 == 19:
	case i%5 == 0:
		labels["feature.node.kubernetes.io/pci-10de.present"] = "true"
	default:
		labels["nvidia.com/gpu.present"] = "true"
		labels["nvidia.com/gpu.product"] = "NVIDIA-H100-80GB-HBM3"
	}
	resources := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("128"), corev1.ResourceMemory: resource.MustParse("1Ti"), corev1.ResourcePods: resource.MustParse("110"),
		"nvidia.com/gpu": resource.MustParse("8"),
	}
	switch i % 10 {
	case 1:
		resources["nvidia.com/gpu"] = resource.MustParse("0")
		resources["nvidia.com/mig-1g.10gb"] = resource.MustParse("56")
	case 2:
		resources["nvidia.com/gpu.shared"] = resource.MustParse("32")
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("gpu-%04d", i), Labels: labels,
			Annotations: map[string]string{"kwok.x-k8s.io/node": "fake"}},
		Status: corev1.NodeStatus{Capacity: resources, Allocatable: resources},
	}
}

// leaks: every third pod asks for every GPU without a GPU limit.
func leaks(i int) bool { return i%3 == 0 }

// fleetPod is pod i, bound to a node: leaking, a one-GPU pod, or a plain
// pod as gpuguard admits it (void set).
func fleetPod(i, nodes int) *corev1.Pod {
	c := corev1.Container{Name: "main", Image: "registry.k8s.io/pause:3.10"}
	switch {
	case leaks(i):
		c.Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}
	case i%3 == 1:
		c.Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}
	default:
		c.Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "void"}}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%05d", i)},
		Spec:       corev1.PodSpec{NodeName: fmt.Sprintf("gpu-%04d", i%nodes), Containers: []corev1.Container{c}},
	}
}

// listReports counts gpuguard's Reports and their sizes as stored.
func listReports(t *testing.T, ctx context.Context) (count, largest, total int) {
	t.Helper()
	c, err := controlplane.ReportsClient(s.cp)
	if err != nil {
		t.Fatal(err)
	}
	list := &openreports.ReportList{}
	if err := c.List(ctx, list, client.MatchingLabels(wellknown.OwnedLabels(wellknown.ComponentAudit))); err != nil {
		t.Fatal(err)
	}
	for i := range list.Items {
		raw, err := json.Marshal(&list.Items[i])
		if err != nil {
			t.Fatal(err)
		}
		largest = max(largest, len(raw))
		total += len(raw)
	}
	return len(list.Items), largest, total
}
