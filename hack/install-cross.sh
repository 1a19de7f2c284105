#!/usr/bin/env bash
# Makes sure a C cross compiler exists for each platform in $1 (a
# comma-separated list like linux/amd64,linux/arm64) other than this
# machine's: the node agent is built with cgo, for NVML. Installs Debian's
# gcc-TRIPLE when missing and this is a Debian machine where we are root;
# otherwise says what to install.
set -euo pipefail
platforms="${1:-linux/amd64,linux/arm64}"
host="$(go env GOARCH)"
for platform in ${platforms//,/ }; do
  arch="${platform#linux/}"
  [ "$arch" = "$host" ] && continue
  case "$arch" in
    amd64) triple=x86_64-linux-gnu ;;
    arm64) triple=aarch64-linux-gnu ;;
    *) echo "unsupported platform $platform (want linux/amd64 or linux/arm64)" >&2; exit 2 ;;
  esac
  cc_override="CC_$arch"
  [ -n "${!cc_override:-}" ] && continue
  command -v "$triple-gcc" >/dev/null && continue
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    pkg="gcc-$triple"
    echo "installing $pkg (cgo cross compiler for $platform)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$pkg" >&2 ||
      { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$pkg" >&2; }
  else
    echo "the agent image for $platform needs $triple-gcc: install Debian's gcc-$triple," >&2
    echo "or build only this machine's platform: make images PLATFORMS=linux/$host" >&2
    exit 1
  fi
done
