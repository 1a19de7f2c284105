package verifier

import (
	"os"
	"slices"
	"strconv"
	"testing"

	"github.com/gpuguard/gpuguard/agent/discovery"
)

// TestRealNVMLProcessView needs a real GPU (GPUGUARD_REAL_NVML=1, run by
// hack/gpu-check.sh) and a process holding a CUDA context
// (GPUGUARD_REAL_NVML_PID): the verifier's NVML view lists that PID on a GPU,
// the device table maps every GPU's /dev node, and the PID's cgroup reads
// without error (it names no container outside a kubelet's pod).
func TestRealNVMLProcessView(t *testing.T) {
	if os.Getenv("GPUGUARD_REAL_NVML") != "1" {
		t.Skip("GPUGUARD_REAL_NVML=1 runs the real-NVML checks on a GPU machine")
	}
	b, err := discovery.OpenBackend("nvml", "", os.Getenv("GPUGUARD_NVML_LIBRARY"))
	if err != nil {
		t.Fatal(err)
	}
	if err := discovery.Init(b.Lib); err != nil {
		t.Fatalf("NVML on a GPU machine: %v", err)
	}
	defer b.Lib.Shutdown()
	inv, err := discovery.Discover(b.Lib, discovery.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reached, err := NewDeviceTable(inv).ReachableGPUs("/")
	if err != nil {
		t.Fatal(err)
	}
	if len(reached) != len(inv.GPUs) {
		t.Errorf("this host's /dev reaches %d of %d GPUs by device number: %+v", len(reached), len(inv.GPUs), reached)
	}
	byGPU, err := NVMLProcesses{Lib: b.Lib, GPUs: inv.GPUs}.GPUProcesses()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("NVML processes per GPU: %v", byGPU)
	pid, err := strconv.Atoi(os.Getenv("GPUGUARD_REAL_NVML_PID"))
	if err != nil {
		t.Skip("GPUGUARD_REAL_NVML_PID names no CUDA process; the process view is not checked")
	}
	found := false
	for _, pids := range byGPU {
		found = found || slices.Contains(pids, pid)
	}
	if !found {
		t.Errorf("PID %d holds a CUDA context but NVML lists it on no GPU", pid)
	}
	if _, ok, err := containerOfPID("/proc", pid, map[string]Container{}); err != nil || ok {
		t.Errorf("the cgroup of PID %d: in a container %v, error %v", pid, ok, err)
	}
}
