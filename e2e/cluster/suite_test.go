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
	"crypto/rand"
	"testing"

	"github.com/gpuguard/gpuguard/e2e/framework/controlplane"
	"github.com/gpuguard/gpuguard/e2e/framework/kubenode"
)

const nodeName = "node-1"

var s *suite

type suite struct {
	root, assets string
	cp           *controlplane.ControlPlane
	node         *kubenode.Node
	// published is gpuguard's release in the cluster's registry, trusted
	// through registryCA.
	published  kubenode.Published
	registryCA string
	registry   *controlplane.Registry
	// registryPassword is registryUser's, for the README's repositories.
	registryPassword string
}

// registryUser is who the newcomer logs in to the registry as.
const registryUser = "newcomer"

func TestMain(m *testing.M) {
	kubenode.RunRootSuite(m, "e2e/cluster", run)
}

func run(m *testing.M, root string) (int, error) {
	interrupt := kubenode.OnInterrupt("e2e/cluster")
	lc, err := kubenode.StartLocalCluster(interrupt.Context(), root, nodeName)
	if err != nil {
		return 1, err
	}
	interrupt.SetStop(func(ctx context.Context) { _ = lc.Stop(ctx) })
	s = &suite{root: root, assets: lc.Assets, cp: lc.CP, node: lc.Node, published: lc.Published, registryCA: lc.Registry.CAFile, registry: lc.Registry,
		registryPassword: rand.Text()}
	// What the README publishes goes where a team's own registry keeps it:
	// behind credentials, which only an image pull secret gives the node.
	lc.Registry.Protect(readmePath, registryUser, s.registryPassword)
	code := m.Run()
	return code, lc.Stop(context.Background())
}
