#!/usr/bin/env bash
# make test: every step in the order that fails fastest, with the pinned
# upstream builds (kube-apiserver, etcd, kubelet, containerd, the NVIDIA
# runtime, helm: the longest part of a cold run) started first and run beside
# the Go steps, which need none of them; the end-to-end suites wait for them.
# Prints how long each step took, so that a slow one shows.
set -euo pipefail
cd "$(dirname "$0")/.."
make=(${MAKE:-make} --no-print-directory)
mkdir -p _output
log=_output/upstream-build.log
start=$(date +%s)

# A process group of its own, so that a failing step stops the whole build.
setsid "${make[@]}" node-binaries >"$log" 2>&1 &
builds=$!
trap 'kill -- -$builds 2>/dev/null || true' EXIT
echo "building the pinned upstream binaries in the background (log: $log)"

timings=()
step() {
  local t0=$SECONDS
  echo "== make $1"
  "${make[@]}" "$1"
  timings+=("$(printf '%6ds  make %s' $((SECONDS - t0)) "$1")")
}
summary() {
  echo "== make test took $(( $(date +%s) - start ))s:"
  printf '%s\n' "${timings[@]}"
}

for s in lint unit upstream-charts fuzz images-reproducible; do step "$s"; done

t0=$SECONDS
echo "== waiting for the upstream builds"
if ! wait "$builds"; then
  echo "the upstream builds failed; the end of $log:" >&2
  tail -n 40 "$log" >&2
  exit 1
fi
trap - EXIT
grep -E '^built ' "$log" || true
timings+=("$(printf '%6ds  waiting for the upstream builds (begun at the start)' $((SECONDS - t0)))")

# The README's quick start names make demo: it exits 1 when an example does
# not end as its file name says.
step demo
step e2e
summary
