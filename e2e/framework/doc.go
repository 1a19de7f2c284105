// Package framework holds what both halves of gpuguard's end-to-end harness
// share: building the gpuguard binaries from the repository, starting and
// stopping long-running processes with their logs (Daemon, Tail), free ports,
// polling, reading Prometheus metrics, reading the pinned versions in
// hack/versions.env, and reading admission results (DeniedRules, LastEnv).
// It starts nothing itself and needs neither root nor the upstream binaries.
//
// The harness is split in two on top of it:
//
//   - controlplane starts a control plane (etcd and kube-apiserver, alone
//     through controller-runtime's envtest or with the controller manager and
//     scheduler as a kubeadm cluster runs them), the real gpuguard webhook as
//     its own process, the chart's install, KWOK, an image registry and an
//     API proxy.
//   - kubenode starts a node on such a control plane: containerd, the
//     kubelet, NRI, CNI and kube-proxy, fake GPUs, the test images and the
//     gpuguard agent.
//
// Dependencies point one way: kubenode imports controlplane, and both import
// framework; framework imports neither, and controlplane never imports
// kubenode.
package framework
