#!/usr/bin/env bash
# Copies the OpenReports CRDs (openreports.io/v1alpha1 Report and ClusterReport)
# into the chart from the github.com/openreports/reports-api module at the
# version go.mod pins, so that the chart installs exactly the API the webhook's
# Go types speak. charts/openreports_test.go fails when the two drift.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(go list -m -f '{{.Dir}}' github.com/openreports/reports-api)
version=$(go list -m -f '{{.Version}}' github.com/openreports/reports-api)
out=charts/gpuguard/files/openreports
mkdir -p "$out"
for crd in openreports.io_reports.yaml openreports.io_clusterreports.yaml; do
  cp "$dir/config/crd/$crd" "$out/$crd"
  chmod 0644 "$out/$crd"
done
echo "$version" > "$out/VERSION"
echo "OpenReports CRDs $version copied into $out"
