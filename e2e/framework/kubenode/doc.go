// Package kubenode starts the node half of gpuguard's end-to-end suites: a
// real node joined to a control plane from e2e/framework/controlplane, with
// containerd and the NVIDIA Container Toolkit's runtime, the kubelet, NRI
// (and a no-op NRI plugin for comparison, nrinoop), CNI bridge networking and
// kube-proxy on a whole cluster, fake GPUs (device nodes made with mknod and
// a CDI spec, from the agent's mock backend), the test images (images/),
// and the gpuguard agent. StartLocalCluster puts a whole cluster, registry
// included, together for `make cluster`; RunRootSuite and OnInterrupt are the
// TestMain and signal handling of a suite that runs a node.
//
// It needs root (mknod, mounts, sysctls, network namespaces and the host's
// iptables), runc on the PATH, and the node binaries that
// hack/build-node.sh builds into _output/bin (containerd, its shim, the
// kubelet, kube-proxy, the CNI plugins, the toolkit). NodeReadiness says why
// a machine cannot run one. It imports e2e/framework/controlplane, since a
// node needs an API server, and the shared e2e/framework; nothing in
// controlplane imports it.
package kubenode
