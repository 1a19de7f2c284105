package hardening

import (
	"context"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/gpuguard/gpuguard/internal/wellknown"
)

var gpuLabels = []Label{{"nvidia.com/gpu.present", "true"}, {"feature.node.kubernetes.io/pci-10de.present", "true"}}

func node(name string, labels map[string]string) client.Object {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

func TestAllHardened(t *testing.T) {
	hardenedGFD := node("gfd", map[string]string{"nvidia.com/gpu.present": "true", wellknown.HardenedMarkLabel: "true"})
	hardenedNFD := node("nfd", map[string]string{"feature.node.kubernetes.io/pci-10de.present": "true", wellknown.HardenedMarkLabel: "true"})
	cpu := node("cpu", map[string]string{"kubernetes.io/os": "linux"})
	for _, tc := range []struct {
		name  string
		nodes []client.Object
		want  bool
		why   string
	}{
		{"no node", nil, false, "no GPU node"},
		{"CPU nodes only", []client.Object{cpu}, false, "no GPU node"},
		{"every GPU node hardened, by either label", []client.Object{hardenedGFD, hardenedNFD, cpu}, true, "all 2 GPU nodes"},
		{"one GPU node without the label", []client.Object{hardenedGFD, node("new", map[string]string{"nvidia.com/gpu.present": "true"})}, false, "GPU node new does not report"},
		{"one GPU node reporting false", []client.Object{hardenedNFD, node("soft", map[string]string{"nvidia.com/gpu.present": "true", wellknown.HardenedMarkLabel: "false"})}, false, "GPU node soft"},
		// gpuguard.io/hardened is for node selectors: any kubelet may set it
		// on its own node, so it never turns the injection off.
		{"one GPU node with only the label a kubelet may set", []client.Object{hardenedGFD, node("self", map[string]string{"nvidia.com/gpu.present": "true", wellknown.HardenedLabel: "true"})}, false, "GPU node self does not report"},
		{"a GPU label with another value is no GPU node", []client.Object{hardenedGFD, node("off", map[string]string{"nvidia.com/gpu.present": "false"})}, true, "all 1 GPU nodes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := &Nodes{Reader: fake.NewClientBuilder().WithObjects(tc.nodes...).Build(), GPUNodeLabels: gpuLabels}
			v, err := n.AllHardened(context.Background())
			got, why := v.Hardened, v.Why
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want || !strings.Contains(why, tc.why) {
				t.Errorf("got %v (%s), want %v (%s)", got, why, tc.want, tc.why)
			}
		})
	}
}

func TestParseLabel(t *testing.T) {
	if l, err := ParseLabel("a/b=c=d"); err != nil || l != (Label{"a/b", "c=d"}) {
		t.Errorf("got %v, %v", l, err)
	}
	for _, bad := range []string{"", "novalue", "=x"} {
		if _, err := ParseLabel(bad); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
}

func lease(name, holder string, renewed time.Time, seconds int32) client.Object {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "gpuguard-system"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &metav1.MicroTime{Time: renewed}, LeaseDurationSeconds: &seconds}}
}

// TestEnforcerLeasesCover: a GPU node that is not hardened is covered while
// its node enforcer holds a fresh Lease named after it, in the namespace
// followed; not when the Lease is stale, held by another node, or
// elsewhere.
func TestEnforcerLeasesCover(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	gpu := node("n1", map[string]string{"nvidia.com/gpu.present": "true"})
	for _, tc := range []struct {
		name  string
		lease client.Object
		want  bool
	}{
		{"fresh", lease("gpuguard-enforcer-n1", "n1", now.Add(-30*time.Second), 60), true},
		{"stale", lease("gpuguard-enforcer-n1", "n1", now.Add(-61*time.Second), 60), false},
		{"held by another node", lease("gpuguard-enforcer-n1", "n2", now, 60), false},
		{"released", lease("gpuguard-enforcer-n1", "", now, 60), false},
		{"another node's", lease("gpuguard-enforcer-n2", "n2", now, 60), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientBuilder().WithObjects(gpu, tc.lease).Build()
			n := &Nodes{Reader: c, GPUNodeLabels: gpuLabels, LeaseNamespace: "gpuguard-system", Now: func() time.Time { return now }}
			v, err := n.AllHardened(context.Background())
			got, why := v.Hardened, v.Why
			if err != nil || got != tc.want {
				t.Errorf("covered %v (%s, %v), want %v", got, why, err, tc.want)
			}
			n.LeaseNamespace = "elsewhere"
			if v, _ := n.AllHardened(context.Background()); v.Hardened {
				t.Error("a Lease outside the namespace followed must not count")
			}
		})
	}
}

// TestHardenedMarkNeedsTheAgentsLease: where Leases are followed, the
// hardened mark counts only while the node's agent holds a fresh Lease: a
// mark left by an agent that stopped (and a node reconfigured since) goes
// stale with it. Without Leases followed the mark alone counts, as before.
func TestHardenedMarkNeedsTheAgentsLease(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	marked := node("n1", map[string]string{"nvidia.com/gpu.present": "true", wellknown.HardenedMarkLabel: "true"})
	for _, tc := range []struct {
		name   string
		leases []client.Object
		want   bool
	}{
		{"no Lease", nil, false},
		{"the agent's, fresh", []client.Object{lease("gpuguard-agent-n1", "n1", now.Add(-30*time.Second), 60)}, true},
		{"the agent's, stale", []client.Object{lease("gpuguard-agent-n1", "n1", now.Add(-61*time.Second), 60)}, false},
		{"another node's agent's", []client.Object{lease("gpuguard-agent-n2", "n2", now, 60)}, false},
		{"the node enforcer's, fresh", []client.Object{lease("gpuguard-enforcer-n1", "n1", now, 60)}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientBuilder().WithObjects(append(tc.leases, marked)...).Build()
			n := &Nodes{Reader: c, GPUNodeLabels: gpuLabels, LeaseNamespace: "gpuguard-system", Now: func() time.Time { return now }}
			v, err := n.AllHardened(context.Background())
			got, why := v.Hardened, v.Why
			if err != nil || got != tc.want {
				t.Errorf("hardened %v (%s, %v), want %v", got, why, err, tc.want)
			}
			n.LeaseNamespace = ""
			if v, _ := n.AllHardened(context.Background()); !v.Hardened {
				t.Error("without Leases followed, the mark alone must count")
			}
		})
	}
}

// TestVerdictUntil: a hardened verdict that rests on Leases says when the
// first of them goes stale: a node counts until the last Lease it may count
// on (its enforcer's, or, marked, its agent's) goes stale.
func TestVerdictUntil(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	gpu := map[string]string{"nvidia.com/gpu.present": "true"}
	marked := map[string]string{"nvidia.com/gpu.present": "true", wellknown.HardenedMarkLabel: "true"}
	for _, tc := range []struct {
		name    string
		objects []client.Object
		want    time.Time
	}{
		{"one enforcer", []client.Object{node("n1", gpu), lease("gpuguard-enforcer-n1", "n1", now.Add(-20*time.Second), 60)}, now.Add(40 * time.Second)},
		{"a marked node counts on both of its Leases", []client.Object{node("n1", marked),
			lease("gpuguard-agent-n1", "n1", now.Add(-50*time.Second), 60), lease("gpuguard-enforcer-n1", "n1", now.Add(-20*time.Second), 60)}, now.Add(40 * time.Second)},
		{"an unmarked node counts on its enforcer only", []client.Object{node("n1", gpu),
			lease("gpuguard-agent-n1", "n1", now, 60), lease("gpuguard-enforcer-n1", "n1", now.Add(-50*time.Second), 60)}, now.Add(10 * time.Second)},
		{"the first node to go stale", []client.Object{node("n1", marked), node("n2", gpu),
			lease("gpuguard-agent-n1", "n1", now.Add(-55*time.Second), 60), lease("gpuguard-enforcer-n2", "n2", now, 60)}, now.Add(5 * time.Second)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientBuilder().WithObjects(tc.objects...).Build()
			n := &Nodes{Reader: c, GPUNodeLabels: gpuLabels, LeaseNamespace: "gpuguard-system", Now: func() time.Time { return now }}
			v, err := n.AllHardened(context.Background())
			if err != nil || !v.Hardened {
				t.Fatalf("hardened %v (%s, %v), want true", v.Hardened, v.Why, err)
			}
			if !v.Until.Equal(tc.want) {
				t.Errorf("until %v, want %v", v.Until, tc.want)
			}
		})
	}
}

// TestGPUNodesByAllocatable: a node that advertises a GPU resource is a GPU
// node without any GPU label (no GPU Feature Discovery, no NFD, so no
// agent): unhardened, it keeps the injection on. Once it reports hardened
// it counts; a CPU node's zero of a GPU resource does not make it one.
func TestGPUNodesByAllocatable(t *testing.T) {
	isGPU := func(r string) bool { return strings.HasPrefix(r, "nvidia.com/") }
	gpus := func(n string, labels map[string]string, q string) client.Object {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: labels},
			Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse(q)}}}
	}
	hardened := node("labelled", map[string]string{"nvidia.com/gpu.present": "true", wellknown.HardenedMarkLabel: "true"})
	for _, tc := range []struct {
		name  string
		nodes []client.Object
		want  bool
	}{
		{"an unlabelled node with 8 GPUs", []client.Object{hardened, gpus("bare", nil, "8")}, false},
		{"the same node reporting hardened", []client.Object{hardened, gpus("bare", map[string]string{wellknown.HardenedMarkLabel: "true"}, "8")}, true},
		{"zero GPUs allocatable", []client.Object{hardened, gpus("cpu", nil, "0")}, true},
		// The kubelet reports 0 allocatable while the device plugin has not
		// registered (again); the GPUs are still in the node's capacity.
		{"GPUs in capacity, none allocatable yet", []client.Object{hardened, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "restarting"},
			Status: corev1.NodeStatus{Capacity: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("8")},
				Allocatable: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("0")}}}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := &Nodes{Reader: fake.NewClientBuilder().WithObjects(tc.nodes...).Build(), GPUNodeLabels: gpuLabels, IsGPUResource: isGPU}
			v, err := n.AllHardened(context.Background())
			got, why := v.Hardened, v.Why
			if err != nil || got != tc.want {
				t.Errorf("all hardened %v (%s, %v), want %v", got, why, err, tc.want)
			}
		})
	}
}

// TestForgedLeaseCountsOneDuration: whoever may write a coverage Lease
// chooses its duration and renewal time. Neither keeps a node covered for
// longer than the agents' own duration after the webhook first saw the
// write: a year-long duration counts 60 s, a renewal dated next year counts
// from when it was read, and a Lease that is not written again stops
// counting then.
func TestForgedLeaseCountsOneDuration(t *testing.T) {
	start := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	gpu := node("n1", map[string]string{"nvidia.com/gpu.present": "true"})
	for _, tc := range []struct {
		name  string
		lease client.Object
	}{
		{"the longest duration", lease("gpuguard-enforcer-n1", "n1", start, 2147483647)},
		{"a renewal dated next year", lease("gpuguard-enforcer-n1", "n1", start.AddDate(1, 0, 0), 60)},
		{"both", lease("gpuguard-enforcer-n1", "n1", start.AddDate(1, 0, 0), 2147483647)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := start
			c := fake.NewClientBuilder().WithObjects(gpu, tc.lease).Build()
			n := &Nodes{Reader: c, GPUNodeLabels: gpuLabels, LeaseNamespace: "gpuguard-system", Now: func() time.Time { return now }}
			v, err := n.AllHardened(context.Background())
			if err != nil || !v.Hardened {
				t.Fatalf("covered %v (%s, %v) when first read, want true", v.Hardened, v.Why, err)
			}
			if want := start.Add(60 * time.Second); !v.Until.Equal(want) {
				t.Errorf("counts until %v, want %v (one duration after it was read)", v.Until, want)
			}
			now = start.Add(60 * time.Second)
			if v, _ := n.AllHardened(context.Background()); v.Hardened {
				t.Errorf("still covered one duration after the write was read: %s", v.Why)
			}
		})
	}
}

// TestHonestLeaseCountsFromItsRenewal: a renewal the webhook reads late
// still counts from when it was made, not from when it was read.
func TestHonestLeaseCountsFromItsRenewal(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	c := fake.NewClientBuilder().WithObjects(node("n1", map[string]string{"nvidia.com/gpu.present": "true"}),
		lease("gpuguard-enforcer-n1", "n1", now.Add(-50*time.Second), 60)).Build()
	n := &Nodes{Reader: c, GPUNodeLabels: gpuLabels, LeaseNamespace: "gpuguard-system", Now: func() time.Time { return now }}
	v, err := n.AllHardened(context.Background())
	if err != nil || !v.Hardened || !v.Until.Equal(now.Add(10*time.Second)) {
		t.Errorf("got %v until %v (%v), want covered until %v", v.Hardened, v.Until, err, now.Add(10*time.Second))
	}
}
