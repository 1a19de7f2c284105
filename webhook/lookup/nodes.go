package lookup

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpuguard/gpuguard/policy"
)

// Nodes reads what a node advertises, for a pod created bound to it
// (policy's unhonoured-gpu-request). Such pods are rare (most are placed by
// the scheduler, through pods/binding), so each read goes straight to the
// API server, bounded by timeout, and nothing is cached or watched: memory
// does not grow with the cluster's nodes.
type Nodes struct {
	reader  client.Reader
	timeout time.Duration
}

// NewNodes reads through r, bounding each read to timeout (zero: unbounded).
func NewNodes(r client.Reader, timeout time.Duration) *Nodes {
	return &Nodes{reader: r, timeout: timeout}
}

// NodeAllocatable is the node's status.allocatable, or
// policy.ErrNodeNotFound.
func (n *Nodes) NodeAllocatable(ctx context.Context, name string) (corev1.ResourceList, error) {
	node := &corev1.Node{}
	ctx, cancel := WithReadTimeout(ctx, n.timeout)
	defer cancel()
	switch err := n.reader.Get(ctx, client.ObjectKey{Name: name}, node); {
	case apierrors.IsNotFound(err):
		return nil, policy.ErrNodeNotFound
	case err != nil:
		return nil, err
	}
	return node.Status.Allocatable, nil
}
