package discovery

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvlib/pkg/nvlib/device"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// LibraryName is the NVML shared library the nvml backend opens at Init.
const LibraryName = "libnvidia-ml.so.1"

// ErrLibraryNotFound is returned (wrapped) when NVML cannot be loaded.
var ErrLibraryNotFound = errors.New(LibraryName + " could not be loaded: is the NVIDIA driver installed and is the agent running with the driver's libraries mounted? For a demo without a GPU use --backend=mock:dgxa100")

// Init initialises NVML and turns a missing library into ErrLibraryNotFound.
// The caller must call lib.Shutdown when Init succeeded.
func Init(lib nvml.Interface) error {
	ret := lib.Init()
	switch ret {
	case nvml.SUCCESS:
		return nil
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return ErrLibraryNotFound
	default:
		return fmt.Errorf("initialising NVML: %s", errorString(ret))
	}
}

// Options tune discovery.
type Options struct {
	// SysfsRoot is where /sys is found, used for the NUMA node of a GPU
	// when NVML does not report it. Empty means "/sys".
	SysfsRoot string
}

// Discover enumerates the GPUs and MIG devices of an initialised NVML.
func Discover(lib nvml.Interface, opts Options) (*Inventory, error) {
	inv := &Inventory{}
	driver, ret := lib.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("getting the driver version: %s", errorString(ret))
	}
	inv.DriverVersion = driver
	cuda, ret := lib.SystemGetCudaDriverVersion()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("getting the CUDA driver version: %s", errorString(ret))
	}
	inv.CUDADriverVersion = fmt.Sprintf("%d.%d", cuda/1000, (cuda%1000)/10)

	count, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("counting devices: %s", errorString(ret))
	}
	devlib := device.New(lib)
	for i := 0; i < count; i++ {
		h, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("getting device %d: %s", i, errorString(ret))
		}
		g, err := describeGPU(devlib, h, i, opts)
		if err != nil {
			return nil, fmt.Errorf("device %d: %w", i, err)
		}
		inv.GPUs = append(inv.GPUs, g)
	}
	return inv, nil
}

func describeGPU(devlib device.Interface, h nvml.Device, i int, opts Options) (GPU, error) {
	g := GPU{Index: i, NUMANode: UnknownNUMANode}
	var ret nvml.Return
	if idx, ret := h.GetIndex(); ret == nvml.SUCCESS {
		g.Index = idx
	}
	if g.UUID, ret = h.GetUUID(); ret != nvml.SUCCESS {
		return g, fmt.Errorf("UUID: %s", errorString(ret))
	}
	if g.Name, ret = h.GetName(); ret != nvml.SUCCESS {
		return g, fmt.Errorf("name: %s", errorString(ret))
	}
	mem, ret := h.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return g, fmt.Errorf("memory: %s", errorString(ret))
	}
	g.MemoryBytes = mem.Total
	pci, ret := h.GetPciInfo()
	if ret != nvml.SUCCESS {
		return g, fmt.Errorf("PCI info: %s", errorString(ret))
	}
	g.PCIBusID = normalizePCIBusID(cString(pci.BusId[:]))
	if g.Minor, ret = h.GetMinorNumber(); ret != nvml.SUCCESS {
		return g, fmt.Errorf("minor number: %s", errorString(ret))
	}
	g.NUMANode = numaNode(h, g.PCIBusID, opts.SysfsRoot)

	d, err := devlib.NewDevice(h)
	if err != nil {
		return g, err
	}
	if g.MIGEnabled, err = d.IsMigEnabled(); err != nil {
		return g, err
	}
	if !g.MIGEnabled {
		return g, nil
	}
	err = d.VisitMigDevices(func(j int, m device.MigDevice) error {
		md, err := describeMIG(m, g, j)
		if err != nil {
			return err
		}
		g.MIG = append(g.MIG, md)
		return nil
	})
	return g, err
}

func describeMIG(m device.MigDevice, parent GPU, j int) (MIGDevice, error) {
	md := MIGDevice{ParentIndex: parent.Index, ParentUUID: parent.UUID, Index: j}
	var ret nvml.Return
	if md.UUID, ret = m.GetUUID(); ret != nvml.SUCCESS {
		return md, fmt.Errorf("MIG device %d UUID: %s", j, errorString(ret))
	}
	if md.GPUInstanceID, ret = m.GetGpuInstanceId(); ret != nvml.SUCCESS {
		return md, fmt.Errorf("MIG device %d GPU instance: %s", j, errorString(ret))
	}
	if md.ComputeInstanceID, ret = m.GetComputeInstanceId(); ret != nvml.SUCCESS {
		return md, fmt.Errorf("MIG device %d compute instance: %s", j, errorString(ret))
	}
	if mem, ret := m.GetMemoryInfo(); ret == nvml.SUCCESS {
		md.MemoryBytes = mem.Total
	}
	p, err := m.GetProfile()
	if err != nil {
		return md, fmt.Errorf("MIG device %d profile: %w", j, err)
	}
	md.Profile = p.String()
	return md, nil
}

// numaNode asks NVML, then sysfs; UnknownNUMANode when neither knows.
func numaNode(h nvml.Device, busID, sysfsRoot string) int {
	if n, ret := h.GetNumaNodeId(); ret == nvml.SUCCESS && n >= 0 {
		return n
	}
	if sysfsRoot == "" {
		sysfsRoot = "/sys"
	}
	b, err := os.ReadFile(filepath.Join(sysfsRoot, "bus", "pci", "devices", busID, "numa_node"))
	if err != nil {
		return UnknownNUMANode
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return UnknownNUMANode
	}
	return n
}

// errorString describes an NVML return code without needing the library
// (nvml.ErrorString needs it loaded).
func errorString(ret nvml.Return) string {
	return fmt.Sprintf("NVML return code %d (%s)", int32(ret), ret.String())
}
