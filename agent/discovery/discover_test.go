package discovery

import (
	"errors"
	"github.com/gpuguard/gpuguard/agent/discovery/nvmlmock"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

func discoverMock(t *testing.T, spec, node string) *Inventory {
	t.Helper()
	b, err := OpenBackend(spec, node, "")
	if err != nil {
		t.Fatalf("OpenBackend(%q): %v", spec, err)
	}
	if err := Init(b.Lib); err != nil {
		t.Fatalf("Init: %v", err)
	}
	defer b.Lib.Shutdown()
	inv, err := Discover(b.Lib, Options{})
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	return inv
}

func TestDiscoverEveryMockSystem(t *testing.T) {
	wantName := map[string]string{
		"dgxa100": "A100-SXM4-40GB",
		"dgxh100": "H100 80GB",
		"dgxh200": "H200",
		"dgxb200": "B200",
	}
	for _, sys := range nvmlmock.Systems() {
		t.Run(sys, func(t *testing.T) {
			inv := discoverMock(t, "mock:"+sys, "node-a")
			if len(inv.GPUs) != 8 {
				t.Fatalf("got %d GPUs, want 8", len(inv.GPUs))
			}
			if inv.DriverVersion == "" || inv.CUDADriverVersion == "" {
				t.Fatalf("versions missing: %+v", inv)
			}
			seen := map[string]bool{}
			for i, g := range inv.GPUs {
				if g.Index != i || g.Minor != i {
					t.Errorf("GPU %d: index %d minor %d", i, g.Index, g.Minor)
				}
				if !strings.HasPrefix(g.UUID, "GPU-") || seen[g.UUID] {
					t.Errorf("GPU %d: bad or duplicate UUID %q", i, g.UUID)
				}
				seen[g.UUID] = true
				if !strings.Contains(g.Name, wantName[sys]) {
					t.Errorf("GPU %d: name %q, want it to contain %q", i, g.Name, wantName[sys])
				}
				if g.MemoryBytes < 40<<30 {
					t.Errorf("GPU %d: memory %d bytes", i, g.MemoryBytes)
				}
				if g.PCIBusID != nvmlmock.DGXPCIBusIDs[i] {
					t.Errorf("GPU %d: PCI bus ID %q, want %q", i, g.PCIBusID, nvmlmock.DGXPCIBusIDs[i])
				}
				if wantNUMA := i / 4; g.NUMANode != wantNUMA {
					t.Errorf("GPU %d: NUMA %d, want %d", i, g.NUMANode, wantNUMA)
				}
				if g.MIGEnabled || len(g.MIG) != 0 {
					t.Errorf("GPU %d: unexpected MIG", i)
				}
			}
		})
	}
}

func TestMockDriverVersions(t *testing.T) {
	inv := discoverMock(t, "mock:dgxa100", "n")
	if inv.DriverVersion != "550.54.15" || inv.CUDADriverVersion != "12.4" {
		t.Fatalf("got driver %q CUDA %q", inv.DriverVersion, inv.CUDADriverVersion)
	}
}

func TestMockUUIDsStablePerNode(t *testing.T) {
	a1 := discoverMock(t, "mock:dgxa100", "node-a")
	a2 := discoverMock(t, "mock:dgxa100", "node-a")
	b := discoverMock(t, "mock:dgxa100", "node-b")
	for i := range a1.GPUs {
		if a1.GPUs[i].UUID != a2.GPUs[i].UUID {
			t.Errorf("GPU %d: UUID changed between runs on the same node", i)
		}
		if a1.GPUs[i].UUID == b.GPUs[i].UUID {
			t.Errorf("GPU %d: same UUID on two nodes", i)
		}
	}
}

func TestDiscoverMIG(t *testing.T) {
	inv := discoverMock(t, "mock:dgxa100:mig", "node-a")
	if !inv.GPUs[0].MIGEnabled || !inv.GPUs[1].MIGEnabled || inv.GPUs[2].MIGEnabled {
		t.Fatalf("MIG modes: %v %v %v", inv.GPUs[0].MIGEnabled, inv.GPUs[1].MIGEnabled, inv.GPUs[2].MIGEnabled)
	}
	var got []string
	for _, m := range inv.MIGDevices() {
		if !strings.HasPrefix(m.UUID, "MIG-") {
			t.Errorf("MIG UUID %q", m.UUID)
		}
		got = append(got, m.IndexID()+"="+m.Profile)
	}
	want := "0:0=1g.5gb 0:1=1g.5gb 0:2=1g.5gb 0:3=1g.5gb 0:4=3g.20gb 1:0=2g.10gb 1:1=2g.10gb 1:2=3g.20gb"
	if strings.Join(got, " ") != want {
		t.Fatalf("MIG devices\n got %s\nwant %s", strings.Join(got, " "), want)
	}
	if m := inv.GPUs[0].MIG[4]; m.ParentUUID != inv.GPUs[0].UUID || m.MemoryBytes == 0 {
		t.Fatalf("MIG device parent/memory: %+v", m)
	}
}

func TestDiscoverMIGOnH100(t *testing.T) {
	inv := discoverMock(t, "mock:dgxh100:mig", "n")
	if got := inv.GPUs[0].MIG[0].Profile; got != "1g.10gb" {
		t.Fatalf("H100 1-slice profile %q, want 1g.10gb", got)
	}
}

func TestMissingLibraryIsAClearError(t *testing.T) {
	b, err := OpenBackend("nvml", "n", filepath.Join(t.TempDir(), "libnvidia-ml.so.1"))
	if err != nil {
		t.Fatal(err)
	}
	err = Init(b.Lib)
	if !errors.Is(err, ErrLibraryNotFound) {
		t.Fatalf("got %v, want ErrLibraryNotFound", err)
	}
	for _, want := range []string{"libnvidia-ml.so.1", "--backend=mock:dgxa100"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestBadBackendSpecs(t *testing.T) {
	for _, spec := range []string{"mock:", "mock:dgx9000", "mock:dgxa100:weird", "cuda", "mock"} {
		if _, err := OpenBackend(spec, "n", ""); err == nil {
			t.Errorf("OpenBackend(%q): no error", spec)
		}
	}
}

func TestDiscoveryErrorsAreReported(t *testing.T) {
	n, err := nvmlmock.NewNode("dgxa100", nvmlmock.Options{NodeName: "n"})
	if err != nil {
		t.Fatal(err)
	}
	n.Server.Devices[3].(*server.Device).GetUUIDFunc = func() (string, nvml.Return) { return "", nvml.ERROR_UNKNOWN }
	_, err = Discover(n.Server, Options{})
	if err == nil || !strings.Contains(err.Error(), "device 3") {
		t.Fatalf("got %v, want an error naming device 3", err)
	}
}

func TestNUMAFallsBackToSysfs(t *testing.T) {
	sys := t.TempDir()
	dir := filepath.Join(sys, "bus", "pci", "devices", "0000:47:00.0")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "numa_node"), []byte("3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := &mock.Device{GetNumaNodeIdFunc: func() (int, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }}
	if got := numaNode(d, "0000:47:00.0", sys); got != 3 {
		t.Errorf("sysfs NUMA: got %d, want 3", got)
	}
	if got := numaNode(d, "0000:48:00.0", sys); got != UnknownNUMANode {
		t.Errorf("missing sysfs entry: got %d, want unknown", got)
	}
}

func TestNormalizePCIBusID(t *testing.T) {
	for in, want := range map[string]string{
		"00000000:07:00.0": "0000:07:00.0",
		"0000:4E:00.0":     "0000:4e:00.0",
		"0001:07:00.0":     "0001:07:00.0",
	} {
		if got := normalizePCIBusID(in); got != want {
			t.Errorf("normalizePCIBusID(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestMockEventsRegistration(t *testing.T) {
	n, err := nvmlmock.NewNode("dgxh100", nvmlmock.Options{NodeName: "n"})
	if err != nil {
		t.Fatal(err)
	}
	set, ret := n.Server.EventSetCreate()
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	dev := n.Server.Devices[2]
	if ret := dev.RegisterEvents(nvml.EventTypeXidCriticalError, set); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if n.Events.Registered(dev) != nvml.EventTypeXidCriticalError {
		t.Fatalf("mask %d", n.Events.Registered(dev))
	}
	n.Events.SendXID(dev, 79)
	data, ret := set.Wait(1000)
	if ret != nvml.SUCCESS || data.EventData != 79 || data.Device != dev {
		t.Fatalf("got %+v %v", data, ret)
	}
	if _, ret := set.Wait(1); ret != nvml.ERROR_TIMEOUT {
		t.Fatalf("empty queue: got %v, want timeout", ret)
	}
	n.Events.FailWait(nvml.ERROR_GPU_IS_LOST)
	if _, ret := set.Wait(1000); ret != nvml.ERROR_GPU_IS_LOST {
		t.Fatalf("got %v", ret)
	}
}
