//go:build e2e

// Package cluster is the install suite: a whole single-node cluster (etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler, a kubelet on
// containerd and runc, kube-proxy, a CNI bridge), all built from pinned
// sources, where the README's Helm walkthrough runs command by command with
// the real helm and kubectl, then the whole chart serves the node's fake GPUs
// to pods the scheduler places. See docs/cluster-e2e.md.
package cluster

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/gpuguard/gpuguard/e2e/framework"
)

const nodeName = "node-1"

var s *suite

type suite struct {
	root, assets string
	cp           *framework.ControlPlane
	node         *framework.Node
}

func TestMain(m *testing.M) {
	if reason := framework.NodeReadiness(); reason != nil {
		fmt.Printf("e2e/cluster: skipped: %v\n", reason)
		os.Exit(0)
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	code := 1
	if err == nil {
		code, err = run(m, root)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e/cluster:", err)
		code = 1
	}
	os.Exit(code)
}

func run(m *testing.M, root string) (int, error) {
	ctx := context.Background()
	lc, err := framework.StartLocalCluster(ctx, root, nodeName)
	if err != nil {
		return 1, err
	}
	s = &suite{root: root, assets: lc.Assets, cp: lc.CP, node: lc.Node}
	stopOnSignal(lc)
	code := m.Run()
	return code, lc.Stop(ctx)
}

// stopOnSignal stops the node and the control plane when the suite is
// interrupted, so that no daemon, shim or network rule outlives it.
func stopOnSignal(lc *framework.LocalCluster) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-sig
		fmt.Fprintln(os.Stderr, "e2e/cluster: interrupted, stopping the cluster")
		_ = lc.Stop(context.Background())
		os.Exit(2)
	}()
}
