// Package discovery finds the NVIDIA GPUs and MIG devices of a node through
// NVML (github.com/NVIDIA/go-nvml), or through a canned mock node for demos
// and tests.
package discovery

import "strings"

// UnknownNUMANode marks a device whose NUMA node could not be determined.
const UnknownNUMANode = -1

// Inventory is what discovery found on a node.
type Inventory struct {
	DriverVersion     string // e.g. "550.54.15"
	CUDADriverVersion string // e.g. "12.4"
	GPUs              []GPU
}

// GPU is one physical GPU.
type GPU struct {
	Index       int    // NVML (nvidia-smi) index
	UUID        string // "GPU-…"
	Name        string // product name
	MemoryBytes uint64
	PCIBusID    string // lower case, "0000:07:00.0"
	Minor       int    // /dev/nvidia<Minor>
	NUMANode    int    // UnknownNUMANode when not known
	MIGEnabled  bool
	MIG         []MIGDevice // only when MIGEnabled
}

// MIGDevice is one MIG device (a GPU instance plus a compute instance).
type MIGDevice struct {
	ParentIndex       int
	ParentUUID        string
	Index             int // position among the parent's MIG device handles
	UUID              string
	Profile           string // e.g. "1g.5gb"
	GPUInstanceID     int
	ComputeInstanceID int
	MemoryBytes       uint64
}

// IndexID is the nvidia-smi style index of a MIG device: "<gpu>:<mig>".
func (m MIGDevice) IndexID() string {
	return itoa(m.ParentIndex) + ":" + itoa(m.Index)
}

// MIGDevices lists every MIG device of the inventory.
func (inv *Inventory) MIGDevices() []MIGDevice {
	var out []MIGDevice
	for _, g := range inv.GPUs {
		out = append(out, g.MIG...)
	}
	return out
}

// Summary is a one-line description for logs.
func (inv *Inventory) Summary() string {
	var b strings.Builder
	b.WriteString(itoa(len(inv.GPUs)))
	b.WriteString(" GPU(s), driver ")
	b.WriteString(inv.DriverVersion)
	b.WriteString(", CUDA ")
	b.WriteString(inv.CUDADriverVersion)
	if n := len(inv.MIGDevices()); n > 0 {
		b.WriteString(", ")
		b.WriteString(itoa(n))
		b.WriteString(" MIG device(s)")
	}
	return b.String()
}
