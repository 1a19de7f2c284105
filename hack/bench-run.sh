#!/usr/bin/env bash
# Runs one benchmark command (its arguments) and fails when no benchmark
# ran: go test passes when a -bench pattern matches nothing, so a renamed
# or lost benchmark would otherwise pass as a run with no figures.
set -euo pipefail
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$@" | tee "$out"
if ! grep -q '^Benchmark' "$out"; then
	echo "no benchmark ran: $*" >&2
	exit 1
fi
