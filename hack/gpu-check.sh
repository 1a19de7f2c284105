#!/usr/bin/env bash
# The checks that need a real NVIDIA GPU: NVML discovery, the health
# watcher's XID registration, NVML's process view, and the agent's startup
# and hardening report on a real driver. Run it on a GPU machine as root:
#
#   hack/gpu-check.sh [DIR]
#
# DIR holds discovery.test, verify.test and gpuguard-agent (each may be gzipped), built
# elsewhere with `make gpu-check-binaries`; without DIR they are built here.
# Results go to stdout and, when OUT is set, to files under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
dir=${1:-_gpu}
out=${OUT:-$(mktemp -d)}
if [ ! -e "$dir/discovery.test" ] && [ ! -e "$dir/discovery.test.gz" ]; then
  make gpu-check-binaries GPU_CHECK_DIR="$dir" || exit 2
fi
for f in "$dir"/*.gz; do [ -e "$f" ] && gunzip -kf "$f"; done
chmod +x "$dir/discovery.test" "$dir/verify.test" "$dir/gpuguard-agent" 2>/dev/null

echo "== nvidia-smi"
nvidia-smi -L; nvidia-smi --query-gpu=name,uuid,pci.bus_id,driver_version --format=csv

# A process that holds a CUDA context, for NVML's process view.
py=$(command -v python3)
[ -x /opt/torch/.venv/bin/python3 ] && py=/opt/torch/.venv/bin/python3
holder=""
if "$py" -c 'import torch' 2>/dev/null; then
  "$py" -c 'import torch,time; x=torch.ones(1<<20,device="cuda"); torch.cuda.synchronize(); print("ready",flush=True); time.sleep(120)' >"$out/holder.log" 2>&1 &
  holder=$!
  for _ in $(seq 60); do grep -q ready "$out/holder.log" && break; sleep 1; done
  echo "CUDA context holder: PID $holder ($(cat "$out/holder.log"))"
fi

echo "== real-NVML tests"
GPUGUARD_REAL_NVML=1 GPUGUARD_REAL_NVML_PID=$holder "$dir/discovery.test" -test.run 'RealNVML' -test.v -test.count=1 2>&1 | tee "$out/tests.log"
rc=${PIPESTATUS[0]}
if [ -x "$dir/verify.test" ]; then
  echo "== the verifier's NVML process view"
  GPUGUARD_REAL_NVML=1 GPUGUARD_REAL_NVML_PID=$holder "$dir/verify.test" -test.run 'RealNVML' -test.v -test.count=1 2>&1 | tee -a "$out/tests.log"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi

echo "== agent on the real driver (report only)"
"$dir/gpuguard-agent" --backend nvml --device-plugin off --metrics-addr 127.0.0.1:19465 --node-name gpu-check >"$out/agent.log" 2>&1 &
agent=$!
# Ready once the hardening report is published; health checks run by then.
for _ in $(seq 30); do
  curl -sf http://127.0.0.1:19465/metrics >"$out/agent-metrics.txt" && grep -q '^gpuguard_agent_node_hardened' "$out/agent-metrics.txt" && break
  sleep 1
done
curl -sf http://127.0.0.1:19465/healthz; echo " (healthz)"
kill "$agent" 2>/dev/null; wait "$agent" 2>/dev/null
head -c 6000 "$out/agent.log"
grep '^gpuguard_' "$out/agent-metrics.txt" | head -40
[ -n "$holder" ] && kill "$holder" 2>/dev/null
exit "$rc"
