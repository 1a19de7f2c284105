//go:build e2e

// Package node is the node end-to-end suite: pods run through a real
// kubelet, containerd, runc and the NVIDIA Container Runtime on fake GPUs,
// first without gpuguard (the leak), then with it. See docs/node-e2e.md.
package node

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/gpuguard/gpuguard/e2e/framework"
	"github.com/gpuguard/gpuguard/e2e/framework/controlplane"
	"github.com/gpuguard/gpuguard/e2e/framework/kubenode"
)

// Namespaces: the tenant's is guarded by the webhook; the exempt one is left
// out of its namespaceSelector, which stands for "admission bypassed".
const (
	releaseNS = "gpuguard"
	tenantNS  = "team-a"
	exemptNS  = "kube-exempt"
	nodeName  = "gpu-node-1"
)

// withoutGPUGuardEnv, set to 1, never installs gpuguard: the scenarios that
// expect it then fail, which shows the suite detects the leak.
const withoutGPUGuardEnv = kubenode.WithoutGPUGuardEnv

var s *suite

type suite struct {
	root string
	cp   *controlplane.ControlPlane
	node *kubenode.Node
	in   *controlplane.Installation
}

func TestMain(m *testing.M) {
	kubenode.RunRootSuite(m, "e2e/node", run)
}

func run(m *testing.M, root string) (int, error) {
	interrupt := kubenode.OnInterrupt("e2e/node")
	assets := filepath.Join(root, "_output", "bin")
	if err := kubenode.CheckNodeBinaries(assets); err != nil {
		return 1, err
	}
	version, err := framework.ToolkitVersion(root)
	if err != nil {
		return 1, err
	}
	cp, err := controlplane.StartControlPlane(assets)
	if err != nil {
		return 1, err
	}
	defer cp.Stop()
	ctx := context.Background()
	// The agent keeps its findings in an OpenReports ClusterReport.
	if _, err := controlplane.InstallOpenReportsCRDs(ctx, cp, root); err != nil {
		return 1, err
	}
	// releaseNS exists before gpuguard's install: the node enforcer holds
	// its Lease there, as the chart's agent does in the release namespace.
	for _, ns := range []string{tenantNS, exemptNS, releaseNS} {
		if err := controlplane.EnsureNamespace(ctx, cp, ns, nil); err != nil {
			return 1, err
		}
	}
	node, err := kubenode.StartNode(interrupt.Context(), cp, kubenode.NodeOptions{Name: nodeName, RepoRoot: root, Assets: assets,
		ToolkitVersion: version, AgentNamespace: releaseNS})
	if err != nil {
		return 1, err
	}
	s = &suite{root: root, cp: cp, node: node}
	interrupt.SetStop(func(ctx context.Context) {
		_ = node.Stop(ctx)
		_ = cp.Stop()
	})
	code := m.Run()
	if s.in != nil {
		_ = s.in.Uninstall(ctx, cp)
	}
	return code, node.Stop(ctx)
}
