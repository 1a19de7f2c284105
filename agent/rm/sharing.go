package rm

import (
	"fmt"
	"strconv"
)

// ReplicaSeparator joins a device's ID and its replica number in the IDs a
// time-sliced resource advertises ("GPU-…::2"), as NVIDIA's device plugin
// names them; the verifier and PodResources readers strip it.
const ReplicaSeparator = "::"

// SharedSuffix is appended to a time-sliced resource's name when renamed
// (nvidia.com/gpu becomes nvidia.com/gpu.shared), so that pods asking for a
// whole GPU never get a share by mistake.
const SharedSuffix = ".shared"

// TimeSlicing shares each device among Replicas containers, which the GPU
// then runs in turn: no memory or fault isolation between them, so it suits
// trusted tenants and interactive work, as NVIDIA documents for its own
// plugin's sharing.timeSlicing.
type TimeSlicing struct {
	// Replicas is how many containers may share one device; 1 shares
	// nothing.
	Replicas int
	// Rename serves the shares as <resource>.shared.
	Rename bool
}

// Validate rejects a replica count below one.
func (t TimeSlicing) Validate() error {
	if t.Replicas < 1 {
		return fmt.Errorf("--time-slicing-replicas=%d: want 1 (no sharing) or more", t.Replicas)
	}
	return nil
}

// Apply turns each device into Replicas devices that all refer to it.
func (t TimeSlicing) Apply(resources []Resource) ([]Resource, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	if t.Replicas == 1 {
		return resources, nil
	}
	out := make([]Resource, 0, len(resources))
	for _, r := range resources {
		shared := Resource{Name: r.Name}
		if t.Rename {
			shared.Name += SharedSuffix
		}
		shared.Devices = make([]Device, 0, len(r.Devices)*t.Replicas)
		for _, d := range r.Devices {
			for i := range t.Replicas {
				replica := d
				replica.ID = d.ID + ReplicaSeparator + strconv.Itoa(i)
				replica.Replica = true
				shared.Devices = append(shared.Devices, replica)
			}
		}
		out = append(out, shared)
	}
	return out, nil
}
