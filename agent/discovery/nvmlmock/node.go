// Package nvmlmock is a fake NVML: go-nvml's canned servers (DGX A100, H100,
// H200, B200) completed with what gpuguard needs and the mock servers lack:
// stable per-node UUIDs, PCI bus IDs, NUMA nodes, MIG devices, running
// processes and a controllable event set. The agent serves it with
// --backend=mock:NAME, for the node suite and demos; nothing else uses it.
package nvmlmock

import (
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxb200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/google/uuid"
)

// mockSystems are go-nvml's canned 8-GPU servers.
var mockSystems = map[string]func() *server.Server{
	"dgxa100": dgxa100.New,
	"dgxh100": dgxh100.New,
	"dgxh200": dgxh200.New,
	"dgxb200": dgxb200.New,
}

// Systems lists the names accepted by --backend=mock:NAME.
func Systems() []string {
	names := make([]string, 0, len(mockSystems))
	for n := range mockSystems {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// DGXPCIBusIDs are the bus IDs of the eight GPUs of a DGX-class board, so
// mock nodes look like real ones in logs and in preferred allocations.
var DGXPCIBusIDs = []string{
	"0000:07:00.0", "0000:0f:00.0", "0000:47:00.0", "0000:4e:00.0",
	"0000:87:00.0", "0000:90:00.0", "0000:b7:00.0", "0000:bd:00.0",
}

// Options shape a mock node.
type Options struct {
	// NodeName seeds the device UUIDs, so that they are stable per node.
	NodeName string
	// MIG maps a GPU index to the GPU-instance profile IDs
	// (nvml.GPU_INSTANCE_PROFILE_*) to create on it; such GPUs get MIG mode on.
	MIG map[int][]int
}

// DefaultMIGLayout is the layout of "mock:NAME:mig": GPU 0 carries four
// 1-slice and one 3-slice instance, GPU 1 two 2-slice and one 3-slice.
func DefaultMIGLayout() map[int][]int {
	return map[int][]int{
		0: {nvml.GPU_INSTANCE_PROFILE_1_SLICE, nvml.GPU_INSTANCE_PROFILE_1_SLICE, nvml.GPU_INSTANCE_PROFILE_1_SLICE, nvml.GPU_INSTANCE_PROFILE_1_SLICE, nvml.GPU_INSTANCE_PROFILE_3_SLICE},
		1: {nvml.GPU_INSTANCE_PROFILE_2_SLICE, nvml.GPU_INSTANCE_PROFILE_2_SLICE, nvml.GPU_INSTANCE_PROFILE_3_SLICE},
	}
}

// Node is a go-nvml mock server completed with what the agent needs and
// the canned servers lack: stable UUIDs, PCI bus IDs in PciInfo, NUMA nodes,
// MIG device handles and an event set whose events tests control.
type Node struct {
	Server *server.Server
	Events *Events

	procMu    sync.Mutex
	processes map[int][]uint32 // GPU index -> PIDs of its compute processes
}

// SetProcesses makes NVML report pids as the compute processes of GPU index
// (none when empty), as a CUDA program holding a context there would be.
func (n *Node) SetProcesses(index int, pids ...uint32) {
	n.procMu.Lock()
	defer n.procMu.Unlock()
	n.processes[index] = pids
}

func (n *Node) runningProcesses(index int) []nvml.ProcessInfo {
	n.procMu.Lock()
	defer n.procMu.Unlock()
	out := []nvml.ProcessInfo{}
	for _, pid := range n.processes[index] {
		out = append(out, nvml.ProcessInfo{Pid: pid})
	}
	return out
}

// NewNode builds the mock node called name (see Systems).
func NewNode(name string, opts Options) (*Node, error) {
	ctor, ok := mockSystems[name]
	if !ok {
		return nil, fmt.Errorf("unknown mock system %q (known: %s)", name, strings.Join(Systems(), ", "))
	}
	s := ctor()
	n := &Node{Server: s, Events: NewEvents(), processes: map[int][]uint32{}}
	s.EventSetCreateFunc = n.Events.create
	for i, d := range s.Devices {
		dev := d.(*server.Device)
		dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return n.runningProcesses(i), nvml.SUCCESS }
		dev.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
		dev.UUID = StableUUID("GPU", opts.NodeName, name, fmt.Sprint(i))
		if i < len(DGXPCIBusIDs) {
			dev.PciBusID = DGXPCIBusIDs[i]
		}
		completeMockDevice(dev, i, len(s.Devices))
		if layout, ok := opts.MIG[i]; ok {
			if err := createMockMIG(dev, layout, opts.NodeName, name); err != nil {
				return nil, fmt.Errorf("mock GPU %d: %w", i, err)
			}
		}
	}
	for i := range opts.MIG {
		if i < 0 || i >= len(s.Devices) {
			return nil, fmt.Errorf("MIG layout names GPU %d, the mock has %d", i, len(s.Devices))
		}
	}
	return n, nil
}

// StableUUID derives a UUID-shaped ID from its parts (name-based, SHA-1).
func StableUUID(prefix string, parts ...string) string {
	ns := uuid.NewSHA1(uuid.NameSpaceOID, []byte("gpuguard-agent mock"))
	return prefix + "-" + uuid.NewSHA1(ns, []byte(strings.Join(parts, "/"))).String()
}

func completeMockDevice(dev *server.Device, i, count int) {
	dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		p := nvml.PciInfo{PciDeviceId: dev.Config.PciDeviceId}
		for k := 0; k < len(dev.PciBusID) && k < len(p.BusId)-1; k++ {
			p.BusId[k] = int8(dev.PciBusID[k])
		}
		return p, nvml.SUCCESS
	}
	// Two sockets, half the GPUs on each, as on DGX boards.
	numa := 0
	if count > 1 && i >= count/2 {
		numa = 1
	}
	dev.GetNumaNodeIdFunc = func() (int, nvml.Return) { return numa, nvml.SUCCESS }
	dev.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
		return nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError, nvml.SUCCESS
	}
	dev.RegisterEventsFunc = func(mask uint64, set nvml.EventSet) nvml.Return {
		if ms, ok := set.(*mockEventSet); ok {
			ms.register(dev, mask)
			return nvml.SUCCESS
		}
		return nvml.ERROR_INVALID_ARGUMENT
	}
	dev.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 7, nvml.SUCCESS }
	dev.GetMigDeviceHandleByIndexFunc = func(int) (nvml.Device, nvml.Return) { return nil, nvml.ERROR_NOT_FOUND }
	dev.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return false, nvml.SUCCESS }
	dev.GetGpuInstanceByIdFunc = func(id int) (nvml.GpuInstance, nvml.Return) {
		dev.RLock()
		defer dev.RUnlock()
		for gi := range dev.GpuInstances {
			if int(gi.Info.Id) == id {
				return gi, nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
}

// ciProfileFor is the compute-instance profile spanning a whole GPU
// instance of the given GPU-instance profile.
var ciProfileFor = map[int]int{
	nvml.GPU_INSTANCE_PROFILE_1_SLICE: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE,
	nvml.GPU_INSTANCE_PROFILE_2_SLICE: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE,
	nvml.GPU_INSTANCE_PROFILE_3_SLICE: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE,
	nvml.GPU_INSTANCE_PROFILE_4_SLICE: nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE,
	nvml.GPU_INSTANCE_PROFILE_7_SLICE: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE,
}

func createMockMIG(dev *server.Device, layout []int, node, system string) error {
	if _, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		return fmt.Errorf("enabling MIG: %v", ret)
	}
	var handles []nvml.Device
	for _, giProfile := range layout {
		ciProfile, ok := ciProfileFor[giProfile]
		if !ok {
			return fmt.Errorf("unsupported GPU instance profile %d", giProfile)
		}
		giInfo, ret := dev.GetGpuInstanceProfileInfo(giProfile)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("GPU instance profile %d: %v", giProfile, ret)
		}
		gi, ret := dev.CreateGpuInstance(&giInfo)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("creating GPU instance: %v", ret)
		}
		ciInfo, ret := gi.GetComputeInstanceProfileInfo(ciProfile, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("compute instance profile %d: %v", ciProfile, ret)
		}
		ci, ret := gi.CreateComputeInstance(&ciInfo)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("creating compute instance: %v", ret)
		}
		mgi := gi.(*server.GpuInstance)
		mci := ci.(*server.ComputeInstance)
		mgi.GetComputeInstanceByIdFunc = func(id int) (nvml.ComputeInstance, nvml.Return) {
			mgi.RLock()
			defer mgi.RUnlock()
			for c := range mgi.ComputeInstances {
				if int(c.Info.Id) == id {
					return c, nvml.SUCCESS
				}
			}
			return nil, nvml.ERROR_NOT_FOUND
		}
		giID, ciID := int(mgi.Info.Id), int(mci.Info.Id)
		migUUID := StableUUID("MIG", node, system, dev.UUID, fmt.Sprint(giID), fmt.Sprint(ciID))
		attrs := nvml.DeviceAttributes{
			GpuInstanceSliceCount:     giInfo.SliceCount,
			ComputeInstanceSliceCount: ciInfo.SliceCount,
			MultiprocessorCount:       ciInfo.MultiprocessorCount,
			MemorySizeMB:              giInfo.MemorySizeMB,
		}
		h := &mock.Device{
			GetUUIDFunc:                            func() (string, nvml.Return) { return migUUID, nvml.SUCCESS },
			IsMigDeviceHandleFunc:                  func() (bool, nvml.Return) { return true, nvml.SUCCESS },
			GetDeviceHandleFromMigDeviceHandleFunc: func() (nvml.Device, nvml.Return) { return dev, nvml.SUCCESS },
			GetAttributesFunc:                      func() (nvml.DeviceAttributes, nvml.Return) { return attrs, nvml.SUCCESS },
			GetGpuInstanceIdFunc:                   func() (int, nvml.Return) { return giID, nvml.SUCCESS },
			GetComputeInstanceIdFunc:               func() (int, nvml.Return) { return ciID, nvml.SUCCESS },
			GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
				return nvml.Memory{Total: attrs.MemorySizeMB * 1024 * 1024}, nvml.SUCCESS
			},
		}
		handles = append(handles, h)
	}
	dev.GetMigDeviceHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if i < 0 || i >= 7 {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		if i >= len(handles) {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return handles[i], nvml.SUCCESS
	}
	return nil
}
