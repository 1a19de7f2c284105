#!/usr/bin/env bash
# Builds the node stack the node end-to-end suite (e2e/node) runs, pinned in
# hack/versions.env, from the Go module proxy:
#   kubelet and the rest of a cluster (through hack/build-upstream.sh with
#   CLUSTER=1: the same build module as kube-apiserver, helm, CNI plugins),
#   containerd, containerd-shim-runc-v2 and ctr from github.com/containerd/containerd/v2,
#   nvidia-container-runtime from github.com/NVIDIA/nvidia-container-toolkit;
# and installs runc, nftables and iproute2 from Debian's packages when missing
# (as root only; hack/install-deps.sh).
# Output: _output/bin, with a stamp per binary; built versions are skipped.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=hack/versions.env
source "$root/hack/versions.env"
bin="$root/_output/bin"
mkdir -p "$bin"
export GOWORK=off GOFLAGS=-mod=mod

built() { [ -x "$bin/$1" ] && [ "$(cat "$bin/$1.version" 2>/dev/null)" = "$2" ]; }
stamp() { echo "$2" > "$bin/$1.version"; echo "built $1 $2"; }

CLUSTER=1 bash "$root/hack/build-upstream.sh"

# Neither module has replace directives, so `go install pkg@version` builds
# each binary with exactly the dependency versions upstream released with.
install_pkg() {
  local name=$1 pkg=$2 version=$3 cgo=$4 tags=$5 ldflags=$6
  built "$name" "$version" && return
  echo "building $name $version" >&2
  CGO_ENABLED=$cgo GOBIN="$bin" go install -trimpath -tags "$tags" -ldflags "-s -w $ldflags" "$pkg@$version"
  stamp "$name" "$version"
}

ctrd=github.com/containerd/containerd/v2
ctrd_ldflags="-X $ctrd/version.Version=$CONTAINERD_VERSION"
# no_btrfs: the btrfs snapshotter needs C headers the suite has no use for.
install_pkg containerd "$ctrd/cmd/containerd" "$CONTAINERD_VERSION" 0 no_btrfs "$ctrd_ldflags"
install_pkg containerd-shim-runc-v2 "$ctrd/cmd/containerd-shim-runc-v2" "$CONTAINERD_VERSION" 0 no_btrfs "$ctrd_ldflags"
install_pkg ctr "$ctrd/cmd/ctr" "$CONTAINERD_VERSION" 0 no_btrfs "$ctrd_ldflags"

# The runtime is cgo (it can load NVML); in the suite's `cdi` mode it never does.
nct=github.com/NVIDIA/nvidia-container-toolkit
install_pkg nvidia-container-runtime "$nct/cmd/nvidia-container-runtime" "$NVIDIA_CONTAINER_TOOLKIT_VERSION" 1 "" \
  "-X $nct/internal/info.version=${NVIDIA_CONTAINER_TOOLKIT_VERSION#v}"

# From Debian's packages (hack/packages.txt, rows needed by e2e): runc for
# containerd, nft for the cluster suite's kube-proxy (nftables mode), ip for
# its bridge cleanup. Installed as root; elsewhere the suites skip.
if [ "$(id -u)" = 0 ]; then
  bash "$root/hack/install-deps.sh" e2e
else
  bash "$root/hack/install-deps.sh" --check e2e ||
    echo "not root: the node and cluster suites will skip" >&2
fi
