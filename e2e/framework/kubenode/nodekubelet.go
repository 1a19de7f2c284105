package kubenode

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuguard/gpuguard/e2e/framework"
)

// StartKubelet starts the kubelet and waits until it serves and its Node
// exists. Its root directory, and so its device plugin directory, is under
// the node's root.
func (n *Node) StartKubelet(ctx context.Context) error {
	if n.kubeconfig == "" {
		path, err := n.cp.KubeletKubeconfig(n.Name)
		if err != nil {
			return err
		}
		n.kubeconfig = path
	}
	config := filepath.Join(n.Root, "etc", "kubelet", "config.yaml")
	if err := writeFile(config, n.kubeletConfig()); err != nil {
		return err
	}
	args := []string{"--config", config, "--kubeconfig", n.kubeconfig, "--root-dir", filepath.Join(n.Root, "kubelet"),
		"--cert-dir", filepath.Join(n.Root, "kubelet-pki"), "--hostname-override", n.Name, "--v", "2"}
	if n.cp.Network != nil {
		// The address kube-proxy and the API server know the node by.
		args = append(args, "--node-ip", n.cp.Network.NodeIP.String())
	}
	var err error
	n.kubelet, err = framework.StartDaemon("kubelet", filepath.Join(n.Root, "log"), nil, filepath.Join(n.assets, "kubelet"), args...)
	if err != nil {
		return err
	}
	return framework.Poll(ctx, 2*time.Minute, func() (bool, error) {
		if err := n.kubelet.Exited(); err != nil {
			return false, err
		}
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", n.kubeletHealthzPort))
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		_, err = n.cp.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		return resp.StatusCode == http.StatusOK && err == nil, nil
	})
}

// RestartKubelet stops the kubelet and starts it again, as an upgrade or a
// crash would; the agent must notice and register again.
func (n *Node) RestartKubelet(ctx context.Context) error {
	before := n.registrations()
	if err := n.kubelet.Stop(30 * time.Second); err != nil {
		return err
	}
	if err := n.StartKubelet(ctx); err != nil {
		return err
	}
	return n.waitRegistered(ctx, before)
}

// waitAllocatable waits for a node status reported after since that offers
// every GPU: a status from before could predate a plugin restart.
func (n *Node) waitAllocatable(ctx context.Context, since time.Time) error {
	return framework.Poll(ctx, time.Minute, func() (bool, error) {
		node, err := n.cp.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		resource, perGPU := n.profile.servedResource()
		gpus := node.Status.Allocatable[corev1.ResourceName(resource)]
		return gpus.Value() == int64(n.wholeGPUs()*perGPU) && reportedAfter(node, since), nil
	})
}

// wholeGPUs is how many GPUs the profile serves whole: those not split
// into MIG devices.
func (n *Node) wholeGPUs() int {
	if !n.profile.MIG {
		return len(n.GPUs)
	}
	parents := map[int]bool{}
	for _, m := range n.MIGs {
		parents[m.Parent.Index] = true
	}
	return len(n.GPUs) - len(parents)
}

func reportedAfter(node *corev1.Node, since time.Time) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.LastHeartbeatTime.After(since)
		}
	}
	return false
}
