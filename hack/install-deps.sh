#!/usr/bin/env bash
# Installs the Debian packages listed in hack/packages.txt that are missing,
# then proves each works before anything uses it: every tool runs, and for
# each target platform a one-line cgo program compiles and links with that
# platform's C compiler (so a compiler without its C library headers fails
# here, in seconds, not half an hour into `make test`).
#
#   hack/install-deps.sh [--check] [--platforms LIST] [NEED...]
#
# --check installs nothing: it only proves, and names the package and the
# command that installs it for anything that fails (`make lint` runs this).
# LIST is the image platforms, comma-separated (default
# linux/amd64,linux/arm64); NEED selects rows by what needs them (build,
# images, e2e; default all). CC_<arch> (CC_arm64, say) names another C
# compiler for a platform; its packages are then not required.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
list="$root/hack/packages.txt"
check=0
platforms="linux/amd64,linux/arm64"
needs=()
while [ $# -gt 0 ]; do
  case "$1" in
    --check) check=1 ;;
    --platforms) platforms="${2:?--platforms takes a list}"; shift ;;
    --platforms=*) platforms="${1#*=}" ;;
    build|images|e2e) needs+=("$1") ;;
    *) echo "install-deps: unknown argument $1 (want --check, --platforms LIST, build, images or e2e)" >&2; exit 2 ;;
  esac
  shift
done
[ ${#needs[@]} -gt 0 ] || needs=(build images e2e)

command -v go >/dev/null || { echo "install-deps: go is not on PATH: install Go 1.26 (/usr/local/go/bin)" >&2; exit 1; }
host="linux/$(go env GOARCH)"

triple() {
  case "$1" in
    linux/amd64) echo x86_64-linux-gnu ;;
    linux/arm64) echo aarch64-linux-gnu ;;
    *) echo "install-deps: unsupported platform $1 (want linux/amd64 or linux/arm64)" >&2; return 1 ;;
  esac
}
for p in ${platforms//,/ }; do triple "$p" >/dev/null || exit 2; done

# cc_for names the C compiler cgo uses for a platform, as tools/release does.
cc_for() {
  local p=$1 arch=${1#linux/} override
  override="CC_$arch"
  if [ -n "${!override:-}" ]; then echo "${!override}"
  elif [ "$p" = "$host" ]; then echo "${CC:-gcc}"
  else echo "$(triple "$p")-gcc"
  fi
}

# The rows that apply here: wanted need; a platform row only for a wanted
# image platform other than the host, and none where CC_<arch> overrides.
declare -A pkg_need pkg_for pkg_proof
pkgs=()
platform_wanted() {
  local p=$1 arch=${1#linux/} override
  case "$p" in
    -) return 0 ;;
    host) return 0 ;;
  esac
  [ "$p" = "$host" ] && return 1
  override="CC_$arch"
  [ -z "${!override:-}" ] || return 1
  [[ ",$platforms," == *",$p,"* ]]
}
while read -r name need for proof; do
  [[ -z "$name" || "$name" == \#* ]] && continue
  [[ " ${needs[*]} " == *" $need "* ]] || continue
  platform_wanted "$for" || continue
  pkgs+=("$name"); pkg_need[$name]=$need; pkg_for[$name]=$for; pkg_proof[$name]=$proof
done < "$list"

installed() { [ "$(dpkg-query -W -f '${Status}' "$1" 2>/dev/null)" = "install ok installed" ]; }
have_dpkg=0; command -v dpkg-query >/dev/null && have_dpkg=1
missing() {
  [ $have_dpkg = 1 ] || return 0
  local p out=()
  for p in "$@"; do installed "$p" || out+=("$p"); done
  echo "${out[*]}"
}
install_hint() { echo "apt-get install -y --no-install-recommends $* (or, as root: make deps)"; }

absent=$(missing "${pkgs[@]}")
if [ -n "$absent" ] && [ $check = 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "install-deps: installing $absent" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >&2
    # shellcheck disable=SC2086
    apt-get install -y -q --no-install-recommends $absent >&2
  else
    echo "install-deps: missing $absent, and this is not root on a Debian machine" >&2
  fi
fi

failures=()
fail() { failures+=("$1"); }

# Tools: each row's own command.
for name in "${pkgs[@]}"; do
  proof=${pkg_proof[$name]}
  [ "$proof" = cgo ] && continue
  # shellcheck disable=SC2086
  if ! $proof >/dev/null 2>&1; then
    fail "'$proof' fails (${pkg_need[$name]} needs it): run: $(install_hint "$name")"
  fi
done

# cgo: one build per platform, with the packages of that platform's rows.
proof_dir=$(mktemp -d)
trap 'rm -rf "$proof_dir"' EXIT
printf 'module cgoproof\n\ngo 1.26\n' > "$proof_dir/go.mod"
printf 'package main\n\n// #include <stdint.h>\n// #include <stdlib.h>\nimport "C"\n\nfunc main() { C.free(nil) }\n' > "$proof_dir/main.go"
cgo_platforms=()
for name in "${pkgs[@]}"; do
  [ "${pkg_proof[$name]}" = cgo ] || continue
  p=${pkg_for[$name]}; [ "$p" = host ] && p=$host
  [[ " ${cgo_platforms[*]:-} " == *" $p "* ]] || cgo_platforms+=("$p")
done
for p in ${platforms//,/ }; do
  # A platform with CC_<arch> set has no rows but is still proved.
  [[ " ${cgo_platforms[*]:-} " == *" $p "* ]] || cgo_platforms+=("$p")
done
proved=()
for p in "${cgo_platforms[@]}"; do
  [[ " ${needs[*]} " == *" images "* || "$p" = "$host" ]] || continue
  proved+=("$p")
  cc=$(cc_for "$p")
  if out=$(cd "$proof_dir" && GOWORK=off GOFLAGS= GOOS=linux GOARCH="${p#linux/}" CGO_ENABLED=1 CC="$cc" \
      go build -o /dev/null . 2>&1); then
    continue
  fi
  group=()
  for name in "${pkgs[@]}"; do
    f=${pkg_for[$name]}; [ "$f" = host ] && f=$host
    [ "${pkg_proof[$name]}" = cgo ] && [ "$f" = "$p" ] && group+=("$name")
  done
  absent=$(missing "${group[@]}")
  if [ -n "$absent" ]; then
    fail "a cgo build for $p with $cc fails: $absent not installed; run: $(install_hint "$absent")"
  else
    fail "a cgo build for $p with $cc fails, though its packages (${group[*]:-none: CC_${p#linux/} is set}) are installed:
$(echo "$out" | tail -n 5 | sed 's/^/    /')"
  fi
done

if [ ${#failures[@]} -gt 0 ]; then
  echo "install-deps: what make test needs is not all here:" >&2
  for f in "${failures[@]}"; do echo "  - $f" >&2; done
  exit 1
fi
echo "install-deps: ${#pkgs[@]} packages present; tools run; cgo builds for ${proved[*]} link"
