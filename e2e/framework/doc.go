// Package framework runs gpuguard's end-to-end suites on real components: etcd and
// kube-apiserver built from pinned sources by hack/build-upstream.sh, started through
// controller-runtime's envtest, and the real gpuguard webhook binary as a separate
// process with real certificates. The control plane and the webhook are separate
// pieces so that a suite can add a node (kubelet, containerd, the NVIDIA runtime)
// to the same control plane.
package framework
