package enforcer

import (
	"slices"
	"strconv"
	"strings"

	"github.com/gpuguard/gpuguard/agent/discovery"
	"github.com/gpuguard/gpuguard/internal/dra"
)

// Inventory names the node's GPUs and MIG devices every way an allocation
// or a request may name them.
type Inventory struct {
	byName map[string]device
	// byMinor are the whole GPUs by their device node's minor, the number
	// NVIDIA's DRA driver names them by.
	byMinor map[int]device
}

// device is one allocatable device: a whole GPU or a MIG device.
type device struct {
	// names: UUID and index, of the MIG device for a MIG device.
	names []string
	// minor is the GPU device node it needs (/dev/nvidiaN), its parent's for
	// a MIG device.
	minor int
	// mig: a MIG device, which needs its MIG capability nodes.
	mig bool
}

// NewInventory indexes inv; nil is a node without GPUs.
func NewInventory(inv *discovery.Inventory) *Inventory {
	in := &Inventory{byName: map[string]device{}, byMinor: map[int]device{}}
	if inv == nil {
		return in
	}
	for _, g := range inv.GPUs {
		whole := device{names: []string{g.UUID, strconv.Itoa(g.Index)}, minor: g.Minor}
		for _, n := range whole.names {
			in.byName[n] = whole
		}
		in.byMinor[g.Minor] = whole
		for _, m := range g.MIG {
			mig := device{names: []string{m.UUID, m.IndexID()}, minor: g.Minor, mig: true}
			for _, n := range mig.names {
				in.byName[n] = mig
			}
		}
	}
	return in
}

// grant is what an allocation lets a container reach.
type grant struct {
	// visible is the device list that grants exactly the allocation.
	visible []string
	// devices are the allocated devices the inventory knows, each by its
	// names, UUID first.
	devices [][]string
	// names are every name of the allocated devices.
	names map[string]bool
	// minors are the GPU device nodes the allocation needs.
	minors map[int]bool
	// mig: a MIG device is allocated.
	mig bool
	// unknown: an allocated ID names no device of the inventory (a sharing
	// scheduler's own scheme), so which device nodes it needs is unknown.
	unknown bool
}

// grant resolves allocated device IDs: a time-sliced replica
// "<id>::<n>" is its device; an ID the inventory does not know (another
// vendor's, a scheme not understood) is kept as it is, so that it is not
// taken away, but opens no device node.
func (in *Inventory) grant(allocated []string) grant {
	g := grant{names: map[string]bool{}, minors: map[int]bool{}}
	for _, id := range allocated {
		id, _, _ = strings.Cut(id, "::")
		d, ok := in.byName[id]
		if !ok {
			g.names[id] = true
			g.visible = append(g.visible, id)
			g.unknown = true
			continue
		}
		for _, n := range d.names {
			g.names[n] = true
		}
		g.minors[d.minor] = true
		g.mig = g.mig || d.mig
		if !slices.Contains(g.visible, d.names[0]) {
			g.devices = append(g.devices, d.names)
		}
		g.visible = append(g.visible, d.names[0])
	}
	slices.Sort(g.visible)
	g.visible = slices.Compact(g.visible)
	return g
}

// claim adds the devices of the container's DRA claims to g. The DRA
// driver hands them to the runtime as CDI devices (cdi), whose specs give
// the device nodes and set NVIDIA_VISIBLE_DEVICES=void: those CDI names,
// the claimed GPUs' device nodes by number and their own names are
// granted. A claimed device is not added to the device list a variable is
// narrowed to: the DRA driver grants it through CDI, not through the
// variable. A MIG device of the GPU driver grants its parent's node and
// MIG capability nodes, not the parent; a device the inventory cannot
// resolve (a passthrough GPU, another NVIDIA driver's channel) is granted
// by its names only and opens no GPU node: unlike an allocation in an
// unknown scheme, a claim's device names are the driver's own.
func (g *grant) claim(in *Inventory, claimed []ClaimedDevice, cdi []string) {
	for _, name := range cdi {
		g.names[name] = true
		if _, device, ok := strings.Cut(name, "="); ok {
			g.names[device] = true
		}
	}
	for _, c := range claimed {
		g.names[c.Device] = true
		if c.Driver != dra.GPUDriver {
			continue
		}
		minor, mig, ok := dra.ParseGPUDevice(c.Device)
		if !ok {
			continue
		}
		d, known := in.byMinor[minor]
		if !known {
			continue
		}
		g.minors[minor] = true
		if mig {
			g.mig = true
			continue
		}
		for _, n := range d.names {
			g.names[n] = true
		}
	}
}

// covers reports whether a device variable's value grants nothing beyond
// the allocation: void or empty, a device-list mount root (the mounts are
// judged themselves), or allocated devices only, by name or CDI name.
func (g grant) covers(value string, deviceListRoots []string) bool {
	value = strings.TrimSpace(value)
	if value == "" || slices.Contains(strings.Split(value, ","), Void) {
		return true
	}
	if slices.Contains(deviceListRoots, value) {
		return true
	}
	for item := range strings.SplitSeq(value, ",") {
		item = strings.TrimSpace(item)
		// A fully qualified CDI name (KAI's binder writes
		// k8s.device-plugin.nvidia.com/gpu=<uuid> where the device plugin
		// uses CDI) is judged by its device, as a CDI annotation is.
		if _, device, qualified := strings.Cut(item, "="); qualified {
			item = device
		}
		if !g.names[item] {
			return false
		}
	}
	return true
}
