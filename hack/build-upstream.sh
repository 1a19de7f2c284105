#!/usr/bin/env bash
# Builds the upstream binaries the end-to-end suites run, from pinned sources
# fetched through the Go module proxy (release tarballs are not reachable):
#   kube-apiserver (and kubelet with KUBELET=1) from k8s.io/kubernetes,
#   etcd from go.etcd.io/etcd/server/v3, kwok from sigs.k8s.io/kwok (e2e/scale);
# with CLUSTER=1 also what a whole cluster needs (e2e/cluster):
#   kube-controller-manager, kube-scheduler, kube-proxy and kubectl,
#   helm from helm.sh/helm/v3, and the CNI plugins bridge, host-local and
#   loopback from github.com/containernetworking/plugins.
# Output: _output/bin, with a stamp per binary; binaries whose pinned version is
# already built are skipped. KUBEBUILDER_ASSETS=_output/bin points envtest at them.
set -euo pipefail
# Errors inside $(...) stop the script too (kube_module runs in one).
shopt -s inherit_errexit
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=hack/versions.env
source "$root/hack/versions.env"
bin="$root/_output/bin"
work="$root/_output/build"
mkdir -p "$bin/cni" "$work"
export GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0

built() { [ -x "$bin/$1" ] && [ "$(cat "$bin/$1.version" 2>/dev/null)" = "$2" ]; }
stamp() { echo "$2" > "$bin/$1.version"; echo "built $1 $2"; }

# k8s.io/kubernetes points every k8s.io/* staging module at ./staging/...; a build
# module replaces each with the published module of the matching version.
kube_module() {
  local dir="$work/kubernetes-$KUBERNETES_VERSION"
  # .complete is written last: a module whose making was interrupted, or made
  # for fewer commands by an older script, is made again.
  [ -f "$dir/.complete" ] && grep -q '"k8s.io/kubernetes/cmd/kubectl"' "$dir/tools.go" && { echo "$dir"; return; }
  rm -rf "$dir"
  mkdir -p "$dir"
  local mod staging_version
  mod=$(cd "$dir" && go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  [ -n "$mod" ] || { echo "k8s.io/kubernetes@$KUBERNETES_VERSION: no go.mod from the module proxy" >&2; return 1; }
  staging_version="v0${KUBERNETES_VERSION#v1}"
  {
    echo "module gpuguard.test/kubebuild"
    echo "go 1.26"
    echo "require k8s.io/kubernetes $KUBERNETES_VERSION"
    grep -oE '^\s+k8s.io/[a-z0-9-]+ => ./staging/' "$mod" | awk -v v="$staging_version" '{print "replace " $1 " => " $1 " " v}'
  } > "$dir/go.mod"
  # The first tidy only fills go.sum for the requirement; its errors are
  # expected, the second one's are not.
  (cd "$dir" && { go mod tidy -e >/dev/null 2>&1 || true; }
   { printf '//go:build tools\n\npackage tools\n\nimport (\n'
     for c in kube-apiserver kubelet kube-controller-manager kube-scheduler kube-proxy kubectl; do
       printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$c"
     done
     printf ')\n'; } > tools.go
   go mod tidy >&2)
  touch "$dir/.complete"
  echo "$dir"
}

# build_kube builds the named commands of k8s.io/kubernetes that are not built
# yet, in one go build: the commands share most of their packages, and one
# invocation compiles each once and links the binaries side by side.
build_kube() {
  local todo=() name
  for name in "$@"; do built "$name" "$KUBERNETES_VERSION" || todo+=("$name"); done
  [ ${#todo[@]} -gt 0 ] || return 0
  local dir; dir=$(kube_module)
  local out="$work/kube-out"
  rm -rf "$out" && mkdir -p "$out"
  echo "building ${todo[*]} $KUBERNETES_VERSION (several minutes on a cold cache)" >&2
  (cd "$dir" && go build -trimpath -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${KUBERNETES_VERSION#v1.}" \
    -o "$out/" "${todo[@]/#/k8s.io/kubernetes/cmd/}")
  for name in "${todo[@]}"; do
    mv "$out/$name" "$bin/$name"
    stamp "$name" "$KUBERNETES_VERSION"
  done
}

build_etcd() {
  built etcd "$ETCD_VERSION" && return
  local dir="$work/etcd-$ETCD_VERSION"
  mkdir -p "$dir"
  echo "building etcd $ETCD_VERSION" >&2
  [ -f "$dir/go.mod" ] || printf 'module gpuguard.test/etcdbuild\n\ngo 1.26\n' > "$dir/go.mod"
  (cd "$dir" && go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >&2 &&
    go build -trimpath -ldflags "-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3)
  stamp etcd "$ETCD_VERSION"
}

# A module of its own per tool, holding exactly the released dependencies.
build_tool() {
  local name=$1 module=$2 version=$3 pkg=$4 ldflags=${5:-}
  built "$name" "$version" && return
  local dir="$work/$name-$version"
  mkdir -p "$dir"
  echo "building $name $version" >&2
  [ -f "$dir/go.mod" ] || printf 'module gpuguard.test/%sbuild\n\ngo 1.26\n' "$name" > "$dir/go.mod"
  (cd "$dir" && go get "$module@$version" >&2 &&
    go build -trimpath -ldflags "-s -w $ldflags" -o "$bin/$name" "$pkg")
  stamp "$name" "$version"
}

kube=(kube-apiserver)
if [ "${KUBELET:-0}" = 1 ] || [ "${CLUSTER:-0}" = 1 ]; then kube+=(kubelet); fi
if [ "${CLUSTER:-0}" = 1 ]; then kube+=(kube-controller-manager kube-scheduler kube-proxy kubectl); fi
build_etcd
build_kube "${kube[@]}"
build_tool kwok sigs.k8s.io/kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok
# KWOK runs no stage of its own: the module's "fast" stages (nodes Ready at
# once, heartbeats through Leases; pods Running at once, gone on deletion).
if [ ! -f "$bin/kwok-stages.yaml" ] || [ "$(cat "$bin/kwok-stages.version" 2>/dev/null)" != "$KWOK_VERSION" ]; then
  kwok_dir=$(cd "$work/kwok-$KWOK_VERSION" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)
  for f in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease \
    pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do
    echo "---"; cat "$kwok_dir/kustomize/stage/$f.yaml"
  done > "$bin/kwok-stages.yaml"
  echo "$KWOK_VERSION" > "$bin/kwok-stages.version"
fi
if [ "${CLUSTER:-0}" = 1 ]; then
  build_tool helm helm.sh/helm/v3 "$HELM_VERSION" helm.sh/helm/v3/cmd/helm \
    "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  # The plugins are found by containerd in a directory of their own.
  cni=github.com/containernetworking/plugins
  for p in main/bridge main/loopback ipam/host-local; do
    build_tool "cni/$(basename "$p")" "$cni" "$CNI_PLUGINS_VERSION" "$cni/plugins/$p"
  done
fi
