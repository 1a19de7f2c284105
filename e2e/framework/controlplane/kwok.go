package controlplane

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuguard/gpuguard/e2e/framework"
)

// KWOK is sigs.k8s.io/kwok's controller, built from pinned sources by
// hack/build-upstream.sh, keeping simulated nodes alive against a control
// plane: every Node is Ready with a Lease heartbeat, every pod bound to one
// Running, with the "fast" stages of its module (assets/kwok-stages.yaml).
type KWOK struct {
	d *framework.Daemon
	// Log is its output.
	Log string
}

// StartKWOK starts KWOK on cp, managing every Node.
func StartKWOK(cp *ControlPlane, assets string) (*KWOK, error) {
	stages := filepath.Join(assets, "kwok-stages.yaml")
	for _, f := range []string{filepath.Join(assets, "kwok"), stages} {
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("%w (make upstream builds KWOK and its stages)", err)
		}
	}
	kubeconfig, err := cp.Kubeconfig("kwok")
	if err != nil {
		return nil, err
	}
	d, err := framework.StartDaemon("kwok", cp.Dir(), nil, filepath.Join(assets, "kwok"),
		"--kubeconfig", kubeconfig, "--config", stages, "--manage-all-nodes=true",
		"--node-lease-duration-seconds=40", "--server-address=127.0.0.1:0",
		// Room for a pod address each at 30,000 pods.
		"--cidr=10.0.0.1/8")
	if err != nil {
		return nil, err
	}
	return &KWOK{d: d, Log: d.Log}, nil
}

// Stop stops KWOK.
func (k *KWOK) Stop() error { return k.d.Stop(10 * time.Second) }

// WaitNodesReady waits until want Nodes are Ready.
func (k *KWOK) WaitNodesReady(ctx context.Context, cp *ControlPlane, want int, timeout time.Duration) error {
	return framework.Poll(ctx, timeout, func() (bool, error) {
		if err := k.d.Exited(); err != nil {
			return false, err
		}
		nodes, err := cp.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return false, nil
		}
		ready := 0
		for _, n := range nodes.Items {
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		return ready >= want, nil
	})
}
