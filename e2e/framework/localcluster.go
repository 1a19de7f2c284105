package framework

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
)

// LocalCluster is a whole single-node cluster on this machine, built from
// the pinned sources: a kubeadm-like control plane, a node with a pod network
// and kube-proxy, and gpuguard's image in the node's containerd under the
// references the chart installs by default, as if pulled, and the agent's
// image beside it. The node has the node suite's fake GPUs; the chart's agent
// DaemonSet selects nodes labelled nvidia.com/gpu.present=true or
// feature.node.kubernetes.io/pci-10de.present=true, which the node
// is not until a test labels it, and serves them only with the mock backend
// (no NVIDIA driver here).
type LocalCluster struct {
	CP     *ControlPlane
	Node   *Node
	Assets string
	// Images are the chart's default image references, loaded in the node.
	Images ChartImages

	stopOnce sync.Once
	stopErr  error
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
	if err := ctx.Err(); err != nil {
		return nil, errors.Join(err, lc.Stop(context.Background()))
	}
	if err := lc.loadImages(ctx, repoRoot); err != nil {
		return nil, errors.Join(err, lc.Stop(context.Background()))
	}
	return lc, nil
}

// loadImages builds gpuguard's and the agent's images and puts them in the
// node's containerd, as a pull from the registry would.
func (lc *LocalCluster) loadImages(ctx context.Context, repoRoot string) error {
	refs, err := ChartDefaultImages(repoRoot)
	if err != nil {
		return err
	}
	lc.Images = refs
	gpuguard, err := BuildGPUGuardImage(repoRoot, lc.Node.Root, refs.GPUGuard)
	if err != nil {
		return err
	}
	agent, err := BuildAgentImage(repoRoot, lc.Node.Root, refs.Agent)
	if err != nil {
		return err
	}
	return errors.Join(lc.Node.ImportImages(ctx, gpuguard), lc.Node.ImportImages(ctx, agent))
}

// Stop stops the controllers, so that no pod comes back, then the node (its
// pods first), then the rest of the control plane. Calls after the first,
// from an interrupt handler say, wait for it and return its result.
func (lc *LocalCluster) Stop(ctx context.Context) error {
	lc.stopOnce.Do(func() {
		lc.stopErr = errors.Join(lc.CP.StopControllers(), lc.Node.Stop(ctx), lc.CP.Stop())
	})
	return lc.stopErr
}
