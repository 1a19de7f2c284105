#!/usr/bin/env bash
# Builds the upstream binaries the end-to-end suites run, from pinned sources
# fetched through the Go module proxy (release tarballs are not reachable):
#   kube-apiserver (and kubelet with KUBELET=1) from k8s.io/kubernetes,
#   etcd from go.etcd.io/etcd/server/v3.
# Output: _output/bin, with a stamp per binary; binaries whose pinned version is
# already built are skipped. KUBEBUILDER_ASSETS=_output/bin points envtest at them.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=hack/versions.env
source "$root/hack/versions.env"
bin="$root/_output/bin"
work="$root/_output/build"
mkdir -p "$bin" "$work"
export GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0

built() { [ -x "$bin/$1" ] && [ "$(cat "$bin/$1.version" 2>/dev/null)" = "$2" ]; }
stamp() { echo "$2" > "$bin/$1.version"; echo "built $1 $2"; }

# k8s.io/kubernetes points every k8s.io/* staging module at ./staging/...; a build
# module replaces each with the published module of the matching version.
kube_module() {
  local dir="$work/kubernetes-$KUBERNETES_VERSION"
  [ -f "$dir/go.sum" ] && { echo "$dir"; return; }
  mkdir -p "$dir"
  local mod staging_version
  mod=$(cd "$dir" && go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  staging_version="v0${KUBERNETES_VERSION#v1}"
  {
    echo "module gpuguard.test/kubebuild"
    echo "go 1.26"
    echo "require k8s.io/kubernetes $KUBERNETES_VERSION"
    grep -oE '^\s+k8s.io/[a-z0-9-]+ => ./staging/' "$mod" | awk -v v="$staging_version" '{print "replace " $1 " => " $1 " " v}'
  } > "$dir/go.mod"
  (cd "$dir" && go mod tidy -e >/dev/null 2>&1 || true
   printf 'package tools\n\nimport (\n\t_ "k8s.io/kubernetes/cmd/kube-apiserver"\n\t_ "k8s.io/kubernetes/cmd/kubelet"\n)\n' > tools.go
   sed -i '1s/^/\/\/go:build tools\n\n/' tools.go
   go mod tidy >&2)
  echo "$dir"
}

build_kube() {
  local name=$1
  built "$name" "$KUBERNETES_VERSION" && return
  local dir; dir=$(kube_module)
  echo "building $name $KUBERNETES_VERSION (several minutes on a cold cache)" >&2
  (cd "$dir" && go build -trimpath -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${KUBERNETES_VERSION#v1.}" \
    -o "$bin/$name" "k8s.io/kubernetes/cmd/$name")
  stamp "$name" "$KUBERNETES_VERSION"
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

build_etcd
build_kube kube-apiserver
if [ "${KUBELET:-0}" = 1 ]; then build_kube kubelet; fi
