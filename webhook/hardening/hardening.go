// Package hardening tells whether every GPU node of the cluster refuses
// device requests in the environment, as gpuguard's node agents report it
// on their Nodes (agent --publish-node-labels). The webhook's
// hardened-cluster profile (--inject-void=auto) turns the void injection
// off only while it does.
package hardening

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpuguard/gpuguard/internal/wellknown"
)

// Nodes reads the GPU nodes' reports.
type Nodes struct {
	// Reader lists Node metadata (a metadata-only cache).
	Reader client.Reader
	// GPUNodeLabels select GPU nodes: a node with any of them is one.
	GPUNodeLabels []Label
}

// Label is one node label, key and value.
type Label struct{ Key, Value string }

// ParseLabel reads KEY=VALUE.
func ParseLabel(s string) (Label, error) {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return Label{}, fmt.Errorf("node label %q: want KEY=VALUE", s)
	}
	return Label{k, v}, nil
}

// AllHardened says whether there is at least one GPU node and every GPU
// node reports wellknown.HardenedMarkLabel=true (which no kubelet can set),
// and why not when not: the first node
// that does not, or that there is none (a cluster without GPU nodes keeps
// injecting, so that the first node to join is covered before it reports).
func (n *Nodes) AllHardened(ctx context.Context) (ok bool, why string, err error) {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NodeList"))
	if err := n.Reader.List(ctx, list); err != nil {
		return false, "", fmt.Errorf("listing nodes: %w", err)
	}
	var gpu []string
	for _, node := range list.Items {
		if !n.isGPUNode(node.Labels) {
			continue
		}
		if node.Labels[wellknown.HardenedMarkLabel] != "true" {
			return false, fmt.Sprintf("GPU node %s does not report %s=true", node.Name, wellknown.HardenedMarkLabel), nil
		}
		gpu = append(gpu, node.Name)
	}
	if len(gpu) == 0 {
		return false, "no GPU node", nil
	}
	slices.Sort(gpu)
	return true, fmt.Sprintf("all %d GPU nodes report %s=true", len(gpu), wellknown.HardenedMarkLabel), nil
}

func (n *Nodes) isGPUNode(labels map[string]string) bool {
	return slices.ContainsFunc(n.GPUNodeLabels, func(l Label) bool {
		v, ok := labels[l.Key]
		return ok && v == l.Value
	})
}
