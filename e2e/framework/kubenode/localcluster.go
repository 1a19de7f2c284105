package kubenode

import (
	"context"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"sync"

	"github.com/google/go-containerregistry/pkg/v1/remote"
	"helm.sh/helm/v3/pkg/registry"

	"github.com/gpuguard/gpuguard/e2e/framework"
	"github.com/gpuguard/gpuguard/e2e/framework/controlplane"
	"github.com/gpuguard/gpuguard/tools/release"
)

// LocalCluster is a whole single-node cluster on this machine, built from
// the pinned sources: a kubeadm-like control plane, a node with a pod network
// and kube-proxy, and an OCI registry on loopback that the node trusts,
// holding gpuguard's images (built for this machine's platform by the
// release tooling, as `make images` builds them) and its chart pinned to
// them by digest, as `make push` publishes them. The node has the node
// suite's fake GPUs; the chart's agent DaemonSet selects nodes labelled
// nvidia.com/gpu.present=true or feature.node.kubernetes.io/pci-10de.present=true,
// which the node is not until a test labels it, and serves them only with
// the mock backend (no NVIDIA driver here).
type LocalCluster struct {
	CP       *controlplane.ControlPlane
	Node     *Node
	Assets   string
	Registry *controlplane.Registry
	// Published is what the registry holds.
	Published Published

	stopOnce sync.Once
	stopErr  error
}

// Published is gpuguard's release in the registry.
type Published struct {
	// Registry is what `make push REGISTRY=...` was given: the images are
	// REGISTRY/gpuguard and REGISTRY/gpuguard-agent, the chart
	// oci://REGISTRY/charts/gpuguard.
	Registry string
	// GPUGuard and Agent are the images by digest.
	GPUGuard, Agent string
	Chart           release.PushedChart
}

// StartLocalCluster starts a LocalCluster with the programs in
// repoRoot/_output/bin (make node-binaries builds them).
func StartLocalCluster(ctx context.Context, repoRoot, nodeName string) (*LocalCluster, error) {
	assets := filepath.Join(repoRoot, "_output", "bin")
	if err := CheckNodeBinaries(assets); err != nil {
		return nil, err
	}
	version, err := framework.ToolkitVersion(repoRoot)
	if err != nil {
		return nil, err
	}
	cp, err := controlplane.StartClusterControlPlane(ctx, assets)
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
	if err := lc.publish(ctx, repoRoot); err != nil {
		return nil, errors.Join(err, lc.Stop(context.Background()))
	}
	return lc, nil
}

// publish starts the registry, makes the node trust it, and pushes
// gpuguard's images and chart there with the release tooling.
func (lc *LocalCluster) publish(ctx context.Context, repoRoot string) error {
	dir := filepath.Join(lc.Node.Root, "release")
	reg, err := controlplane.StartRegistry(lc.Node.Root)
	if err != nil {
		return err
	}
	lc.Registry = reg
	if err := lc.Node.TrustRegistry(reg.Host, reg.CAFile); err != nil {
		return err
	}
	src, err := release.ReadSource(repoRoot)
	if err != nil {
		return err
	}
	layout := filepath.Join(dir, "layout")
	if _, err := release.Build(ctx, src, release.Specs(), []release.Platform{release.HostPlatform()}, layout, filepath.Join(dir, "work")); err != nil {
		return err
	}
	pushed, err := release.Push(ctx, layout, reg.Host, nil, remote.WithTransport(reg.Transport()))
	if err != nil {
		return err
	}
	client, err := registry.NewClient(registry.ClientOptHTTPClient(&http.Client{Transport: reg.Transport()}), registry.ClientOptWriter(io.Discard))
	if err != nil {
		return err
	}
	chart, err := release.PushChart(filepath.Join(repoRoot, "charts", "gpuguard"), reg.Host, pushed, client)
	if err != nil {
		return err
	}
	lc.Published = Published{Registry: reg.Host, Chart: chart}
	for _, p := range pushed {
		switch p.Name {
		case "gpuguard":
			lc.Published.GPUGuard = p.Ref()
		case "gpuguard-agent":
			lc.Published.Agent = p.Ref()
		}
	}
	return nil
}

// Stop stops the controllers, so that no pod comes back, then the node (its
// pods first), then the rest of the control plane. Calls after the first,
// from an interrupt handler say, wait for it and return its result.
func (lc *LocalCluster) Stop(ctx context.Context) error {
	lc.stopOnce.Do(func() {
		lc.stopErr = errors.Join(lc.CP.StopControllers(), lc.Node.Stop(ctx), lc.CP.Stop())
		if lc.Registry != nil {
			lc.stopErr = errors.Join(lc.stopErr, lc.Registry.Stop(ctx))
		}
	})
	return lc.stopErr
}
