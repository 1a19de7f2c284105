package framework

import (
	"context"
	"errors"
	"path/filepath"
)

// LocalCluster is a whole single-node cluster on this machine, built from
// the pinned sources: a kubeadm-like control plane, a node with a pod network
// and kube-proxy, and gpuguard's image in the node's containerd under the
// reference the chart installs by default, as if pulled. It has no GPUs the
// chart's agent can use: the agent needs the NVIDIA driver, and its
// DaemonSet selects nodes labelled nvidia.com/gpu.present=true.
type LocalCluster struct {
	CP     *ControlPlane
	Node   *Node
	Assets string
}

// StartLocalCluster starts a LocalCluster with the programs in
// repoRoot/_output/bin (make node-binaries builds them).
func StartLocalCluster(ctx context.Context, repoRoot, nodeName string) (*LocalCluster, error) {
	assets := filepath.Join(repoRoot, "_output", "bin")
	if err := CheckNodeBinaries(assets); err != nil {
		return nil, err
	}
	version, err := ToolkitVersion(repoRoot)
	if err != nil {
		return nil, err
	}
	cp, err := StartClusterControlPlane(ctx, assets)
	if err != nil {
		return nil, err
	}
	lc := &LocalCluster{CP: cp, Assets: assets}
	lc.Node, err = StartNode(ctx, cp, NodeOptions{Name: nodeName, RepoRoot: repoRoot, Assets: assets, ToolkitVersion: version})
	if err != nil {
		return nil, errors.Join(err, cp.Stop())
	}
	if err := lc.loadGPUGuardImage(ctx, repoRoot); err != nil {
		return nil, errors.Join(err, lc.Stop(ctx))
	}
	return lc, nil
}

// loadGPUGuardImage builds gpuguard's image and puts it in the node's
// containerd, as a pull from the registry would.
func (lc *LocalCluster) loadGPUGuardImage(ctx context.Context, repoRoot string) error {
	ref, err := ChartGPUGuardImage(repoRoot)
	if err != nil {
		return err
	}
	tarball, err := BuildGPUGuardImage(repoRoot, lc.Node.Root, ref)
	if err != nil {
		return err
	}
	return lc.Node.ImportImages(ctx, tarball)
}

// Stop stops the node (its pods first) and the control plane.
func (lc *LocalCluster) Stop(ctx context.Context) error {
	return errors.Join(lc.Node.Stop(ctx), lc.CP.Stop())
}
