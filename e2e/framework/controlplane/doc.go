// Package controlplane starts the control-plane half of gpuguard's
// end-to-end suites on real components: etcd and kube-apiserver, through
// controller-runtime's envtest (StartControlPlane) or, with
// kube-controller-manager and kube-scheduler, the way a kubeadm cluster runs
// them (StartClusterControlPlane); the real `gpuguard webhook` binary as a
// separate process with real certificates (Webhook); gpuguard's chart, its
// webhook configurations and policy (Install); the OpenReports CRDs; KWOK's
// simulated nodes; Lease renewal; a private image registry; and a proxy in
// front of the API server for fault injection.
//
// It needs the upstream binaries that hack/build-upstream.sh builds into
// _output/bin: etcd and kube-apiserver for envtest's control plane, which
// needs no root; ClusterBinaries for a whole cluster (CLUSTER=1, which
// hack/build-node.sh sets), which needs root and nft and ip on the PATH for
// its network; kwok for KWOK. It imports only the shared e2e/framework, never
// the node half, so that a suite without a node (e2e, e2e/scale) does not
// build it.
package controlplane
