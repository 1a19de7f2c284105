// Package rm is the agent's resource manager: it groups what discovery found
// into the resources the node advertises (whole GPUs, MIG profiles,
// time-sliced shares), keeps each device's health, and decides which
// physical devices an allocation stands for and which devices to prefer.
// The device plugin server reaches devices only through it, as NVIDIA's
// plugin does through its internal/rm.
package rm

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/gpuguard/gpuguard/agent/discovery"
	"github.com/gpuguard/gpuguard/agent/strategy"
)

// GPUResource is the resource of full GPUs.
const GPUResource = "nvidia.com/gpu"

// MIG strategies.
const (
	MIGNone  = "none"  // full GPUs only, MIG mode ignored
	MIGMixed = "mixed" // full GPUs plus one resource per MIG profile
)

// Device is one device of a resource as the plugin sees it.
type Device struct {
	// ID is what the kubelet knows the device by: its UUID, or for a
	// time-sliced share "<UUID>::<n>".
	ID string
	// Ref is the physical device (GPU or MIG device) the ID stands for.
	Ref      strategy.DeviceRef
	Replica  bool
	NUMANode int
	PCIBusID string
}

// Resource is a resource name and its devices, in discovery order.
type Resource struct {
	Name    string
	Devices []Device
}

// BuildResources groups the inventory into resources.
func BuildResources(inv *discovery.Inventory, migStrategy string) ([]Resource, error) {
	if migStrategy != MIGNone && migStrategy != MIGMixed {
		return nil, fmt.Errorf("--mig-strategy=%s: want none or mixed", migStrategy)
	}
	gpus := Resource{Name: GPUResource}
	byProfile := map[string]*Resource{}
	for _, g := range inv.GPUs {
		if migStrategy == MIGNone || !g.MIGEnabled {
			gpus.Devices = append(gpus.Devices, Device{
				ID:       g.UUID,
				Ref:      strategy.DeviceRef{UUID: g.UUID, Index: strconv.Itoa(g.Index)},
				NUMANode: g.NUMANode,
				PCIBusID: g.PCIBusID,
			})
			continue
		}
		for _, m := range g.MIG {
			name := "nvidia.com/mig-" + strings.NewReplacer("+", ".", ",", ".").Replace(m.Profile)
			r := byProfile[name]
			if r == nil {
				r = &Resource{Name: name}
				byProfile[name] = r
			}
			r.Devices = append(r.Devices, Device{
				ID:       m.UUID,
				Ref:      strategy.DeviceRef{UUID: m.UUID, Index: m.IndexID()},
				NUMANode: g.NUMANode,
				PCIBusID: g.PCIBusID,
			})
		}
	}
	var out []Resource
	if len(gpus.Devices) > 0 {
		out = append(out, gpus)
	}
	names := make([]string, 0, len(byProfile))
	for n := range byProfile {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		out = append(out, *byProfile[n])
	}
	return out, nil
}
