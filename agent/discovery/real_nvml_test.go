package discovery_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-logr/logr/testr"
	"golang.org/x/sys/unix"

	"github.com/gpuguard/gpuguard/agent/discovery"
	"github.com/gpuguard/gpuguard/agent/health"
)

// The checks below need a real NVIDIA GPU and driver. They are skipped unless
// GPUGUARD_REAL_NVML=1, and then fail rather than skip when NVML cannot be
// loaded, so that a GPU machine that silently lost its driver does not pass.
// hack/gpu-check.sh runs them on a GPU machine.
const realNVMLEnv = "GPUGUARD_REAL_NVML"

// GPUGUARD_REAL_NVML_PID names a process known to hold a CUDA context, for
// the process view check.
const realNVMLPIDEnv = "GPUGUARD_REAL_NVML_PID"

func realBackend(t *testing.T) nvml.Interface {
	t.Helper()
	if os.Getenv(realNVMLEnv) != "1" {
		t.Skipf("%s=1 runs the real-NVML checks on a GPU machine", realNVMLEnv)
	}
	b, err := discovery.OpenBackend("nvml", "", os.Getenv("GPUGUARD_NVML_LIBRARY"))
	if err != nil {
		t.Fatal(err)
	}
	if err := discovery.Init(b.Lib); err != nil {
		t.Fatalf("NVML on a GPU machine: %v", err)
	}
	t.Cleanup(func() { b.Lib.Shutdown() })
	return b.Lib
}

// TestRealNVMLDiscovery: discovery on a real driver finds every GPU with the
// identity the device plugin and the verifier rely on, and each GPU's minor
// number names a character device of the NVIDIA major.
func TestRealNVMLDiscovery(t *testing.T) {
	lib := realBackend(t)
	inv, err := discovery.Discover(lib, discovery.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("driver %s, CUDA %s: %s", inv.DriverVersion, inv.CUDADriverVersion, inv.Summary())
	count, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS || count == 0 || len(inv.GPUs) != count {
		t.Fatalf("NVML counts %d GPUs (%v), discovery found %d", count, ret, len(inv.GPUs))
	}
	for _, g := range inv.GPUs {
		t.Logf("GPU %d: %s %s bus %s minor %d NUMA %d memory %d MiB MIG %v", g.Index, g.UUID, g.Name, g.PCIBusID,
			g.Minor, g.NUMANode, g.MemoryBytes>>20, g.MIGEnabled)
		if !strings.HasPrefix(g.UUID, "GPU-") || g.Name == "" || g.PCIBusID == "" || g.MemoryBytes == 0 || g.Minor < 0 {
			t.Errorf("GPU %d is described incompletely: %+v", g.Index, g)
		}
		h, ret := lib.DeviceGetHandleByUUID(g.UUID)
		if ret != nvml.SUCCESS {
			t.Errorf("GPU %s cannot be opened by its UUID: %v", g.UUID, ret)
			continue
		}
		if bus, ret := h.GetPciInfo(); ret != nvml.SUCCESS || !strings.EqualFold(cBusID(bus.BusIdLegacy[:]), legacyBusID(g.PCIBusID)) {
			t.Logf("GPU %s: NVML bus id %q (%v) vs discovered %q", g.UUID, cBusID(bus.BusIdLegacy[:]), ret, g.PCIBusID)
		}
		checkDeviceNode(t, "/dev/nvidia"+strconv.Itoa(g.Minor), 195, uint32(g.Minor))
	}
	checkDeviceNode(t, "/dev/nvidiactl", 195, 255)
}

func checkDeviceNode(t *testing.T, path string, major, minor uint32) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Errorf("%s: %v", path, err)
		return
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(st.Rdev) != major || unix.Minor(st.Rdev) != minor {
		t.Errorf("%s is mode %o device %d:%d, want a character device %d:%d", path, st.Mode, unix.Major(st.Rdev),
			unix.Minor(st.Rdev), major, minor)
		return
	}
	t.Logf("%s is character device %d:%d", path, major, minor)
}

// TestRealNVMLHealth: the health watcher registers for XID events on a real
// driver (or says per GPU why it cannot) and marks no healthy GPU unhealthy
// over a quiet interval.
func TestRealNVMLHealth(t *testing.T) {
	lib := realBackend(t)
	inv, err := discovery.Discover(lib, discovery.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var updates []health.Update
	w := &health.Watcher{Lib: lib, Inventory: inv, Log: testr.New(t), WaitTimeout: time.Second,
		Update: func(u health.Update) { mu.Lock(); updates = append(updates, u); mu.Unlock() }}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	if err := w.Run(ctx); err != nil {
		t.Fatalf("health watcher: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, u := range updates {
		if !u.Healthy {
			t.Errorf("a quiet GPU was reported unhealthy: %+v", u)
		}
	}
	for _, g := range inv.GPUs {
		h, _ := lib.DeviceGetHandleByUUID(g.UUID)
		supported, ret := h.GetSupportedEventTypes()
		t.Logf("GPU %s: supported event types %#x (%v), XID critical errors supported: %v", g.UUID, supported, ret,
			supported&nvml.EventTypeXidCriticalError != 0)
	}
}

// TestRealNVMLProcessView: NVML lists a process that holds a CUDA context on
// the GPU it uses, with a PID that names it in this PID namespace, and its
// cgroup can be read: what the runtime verifier maps to a container.
func TestRealNVMLProcessView(t *testing.T) {
	lib := realBackend(t)
	want, err := strconv.Atoi(os.Getenv(realNVMLPIDEnv))
	if err != nil {
		t.Skipf("%s names a process with a CUDA context", realNVMLPIDEnv)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		seen, err := processesOnGPUs(lib)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("NVML processes: %v", seen)
		if uuid, ok := seen[uint32(want)]; ok {
			cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", want))
			t.Logf("PID %d on %s; /proc/%d/cgroup (%v):\n%s", want, uuid, want, err, cg)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("PID %d never appeared among NVML's compute processes: %v", want, seen)
		}
		time.Sleep(time.Second) // polling NVML, which has no change notification for processes
	}
}

// processesOnGPUs maps each PID NVML reports (compute and graphics) to its GPU.
func processesOnGPUs(lib nvml.Interface) (map[uint32]string, error) {
	count, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, errors.New(ret.Error())
	}
	seen := map[uint32]string{}
	for i := 0; i < count; i++ {
		h, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, errors.New(ret.Error())
		}
		uuid, _ := h.GetUUID()
		compute, ret := h.GetComputeRunningProcesses()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("compute processes of %s: %v", uuid, ret)
		}
		graphics, ret := h.GetGraphicsRunningProcesses()
		if ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_SUPPORTED {
			return nil, fmt.Errorf("graphics processes of %s: %v", uuid, ret)
		}
		for _, p := range append(compute, graphics...) {
			seen[p.Pid] = uuid
		}
	}
	return seen, nil
}

func cBusID(b []int8) string {
	var s strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		s.WriteByte(byte(c))
	}
	return s.String()
}

// legacyBusID turns "0000:07:00.0" into NVML's legacy "00000000:07:00.0".
func legacyBusID(id string) string {
	if dom, rest, ok := strings.Cut(id, ":"); ok && len(dom) == 4 {
		return "0000" + dom + ":" + rest
	}
	return id
}
