//go:build e2e

package e2e

import (
	"context"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuguard/gpuguard/internal/wellknown"
)

// TestDRAOnlyNodeKeepsInjectionOn: a node whose GPUs only a DRA driver
// publishes (a ResourceSlice of gpu.nvidia.com naming it; no GPU label, no
// nvidia.com/gpu in its status) is a GPU node for injectVoid auto. Every
// other GPU node is covered, so void is off until the driver publishes its
// slice on the new node; then a pod bound to that node gets void, until the
// node's enforcer holds a fresh Lease. Without the ResourceSlice watch the
// node goes unseen and void stays off. A hardened node beside it makes
// sure the suite has a covered GPU node whatever other tests left.
func TestDRAOnlyNodeKeepsInjectionOn(t *testing.T) {
	ctx := context.Background()
	const draNode, hardened = "gpu-dra-only", "gpu-dra-neighbour"
	others := hardenOtherGPUNodes(t, draNode, hardened)
	setNodeLabels(t, hardened, map[string]string{gpuNodeLabel: "true", wellknown.HardenedMarkLabel: "true"})
	keepLeases(t, wellknown.AgentLeasePrefix, append(others, hardened)...)
	setNodeLabels(t, draNode, map[string]string{"kubernetes.io/hostname": draNode})
	wh := startLeaseWebhook(t, draNode, hardened)
	waitVoid(t, wh, false)

	publishGPUSlice(t, draNode)
	waitVoid(t, wh, true)
	bound := plainPod("bound-to-dra-node")
	bound.Spec.NodeName = draNode
	p, err := s.cp.Client.CoreV1().Pods(enforceNS).Create(ctx, bound, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		t.Fatal(err)
	}
	if got := lastEnv(p.Spec.Containers[0], "NVIDIA_VISIBLE_DEVICES"); got != "void" {
		t.Errorf("a pod bound to the uncovered DRA node: NVIDIA_VISIBLE_DEVICES=%q, want void", got)
	}

	keepLeases(t, wellknown.EnforcerLeasePrefix, draNode)
	waitVoid(t, wh, false)
}

// publishGPUSlice creates, until the test ends, a ResourceSlice of NVIDIA's
// DRA driver with one GPU on node, as its kubelet plugin publishes one.
func publishGPUSlice(t *testing.T, node string) {
	t.Helper()
	ctx := context.Background()
	slices := s.cp.Client.ResourceV1().ResourceSlices()
	sl := &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{GenerateName: node + "-gpu.nvidia.com-"},
		Spec: resourcev1.ResourceSliceSpec{Driver: "gpu.nvidia.com", NodeName: &node,
			Pool:    resourcev1.ResourcePool{Name: node, ResourceSliceCount: 1},
			Devices: []resourcev1.Device{{Name: "gpu-0"}}}}
	sl, err := slices.Create(ctx, sl, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("publishing a ResourceSlice (does the API server serve resource.k8s.io/v1?): %v", err)
	}
	t.Cleanup(func() { _ = slices.Delete(ctx, sl.Name, metav1.DeleteOptions{}) })
}
