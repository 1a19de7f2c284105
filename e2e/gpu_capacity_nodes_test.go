//go:build e2e

package e2e

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuguard/gpuguard/internal/wellknown"
)

// TestUnregisteredPluginNodeKeepsInjectionOn: while a GPU node's device
// plugin restarts or has not registered yet, the kubelet reports the GPU
// resource's allocatable as 0 with its capacity kept. With injectVoid auto
// and every other GPU node covered, such a node, if it were not counted as
// a GPU node, would turn void off for a pod bound to it, which then got
// every GPU from the runtime. Its capacity keeps it a GPU node.
func TestUnregisteredPluginNodeKeepsInjectionOn(t *testing.T) {
	ctx := context.Background()
	const restarting, hardened = "gpu-plugin-restarting", "gpu-capacity-neighbour"
	others := hardenOtherGPUNodes(t, restarting, hardened)
	setNodeLabels(t, hardened, map[string]string{gpuNodeLabel: "true", wellknown.HardenedMarkLabel: "true"})
	keepLeases(t, wellknown.AgentLeasePrefix, append(others, hardened)...)
	setNodeLabels(t, restarting, map[string]string{"kubernetes.io/hostname": restarting})
	wh := startLeaseWebhook(t, restarting, hardened)
	waitVoid(t, wh, false)

	nodes := s.cp.Client.CoreV1().Nodes()
	n, err := nodes.Get(ctx, restarting, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status.Capacity = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("8")}
	n.Status.Allocatable = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("0")}
	if _, err := nodes.UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitVoid(t, wh, true)
	bound := plainPod("bound-to-restarting-node")
	bound.Spec.NodeName = restarting
	p, err := s.cp.Client.CoreV1().Pods(enforceNS).Create(ctx, bound, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		t.Fatal(err)
	}
	if got := lastEnv(p.Spec.Containers[0], "NVIDIA_VISIBLE_DEVICES"); got != "void" {
		t.Errorf("a pod bound to the node whose plugin has not registered: NVIDIA_VISIBLE_DEVICES=%q, want void", got)
	}

	keepLeases(t, wellknown.EnforcerLeasePrefix, restarting)
	waitVoid(t, wh, false)
}
