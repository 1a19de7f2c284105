package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpuguard/gpuguard/internal/wellknown"
)

// labelPublisher writes the hardening report onto the agent's Node.
type labelPublisher struct {
	client   kubernetes.Interface
	nodeName string
}

// newInClusterLabelPublisher uses the pod's service account; the agent's
// ClusterRole needs get and patch on nodes.
func newInClusterLabelPublisher(nodeName string) (*labelPublisher, error) {
	if nodeName == "" {
		return nil, errors.New("--publish-node-labels needs the node's name: set NODE_NAME from spec.nodeName, or --node-name")
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("--publish-node-labels: %w", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("--publish-node-labels: %w", err)
	}
	return &labelPublisher{client: client, nodeName: nodeName}, nil
}

// publish merges labels into the node's labels. A merge patch leaves every
// other label alone, and the report always carries the same keys, so no
// stale gpuguard label survives a change.
func (p *labelPublisher) publish(ctx context.Context, labels map[string]string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = p.client.CoreV1().Nodes().Patch(ctx, p.nodeName, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: wellknown.AgentFieldManager})
	if err != nil {
		return fmt.Errorf("labelling node %s: %w", p.nodeName, err)
	}
	return nil
}
