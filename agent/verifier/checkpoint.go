package verifier

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
)

// CheckpointFile is the kubelet device manager's checkpoint, in its device
// plugin directory.
const CheckpointFile = "kubelet_internal_checkpoint"

// The kubelet's PodResources API (List and Get alike) leaves out init
// containers that are not sidecars, whatever it allocated to them: a GPU
// init container would read as allocated nothing, be voided at creation and
// reported while it runs. The device manager's checkpoint, which the
// kubelet writes when it allocates, at the pod's admission and before any
// of its containers is created, records every container, by pod UID. It is
// read only for containers PodResources does not report.

// Checkpoint reads the device manager's checkpoint.
type Checkpoint struct {
	// Path is the checkpoint file.
	Path string
}

// NewCheckpoint reads the checkpoint in a kubelet's device plugin
// directory.
func NewCheckpoint(devicePluginDir string) *Checkpoint {
	return &Checkpoint{Path: filepath.Join(devicePluginDir, CheckpointFile)}
}

// PodDevices are the devices of a pod's containers, by container name and
// resource.
type PodDevices map[string]map[string][]string

// checkpointData is the part of the kubelet's checkpoint (devicemanager
// checkpoint.Data, format v2, JSON) that names allocations.
type checkpointData struct {
	Data struct {
		PodDeviceEntries []struct {
			PodUID        string
			ContainerName string
			ResourceName  string
			// DeviceIDs by NUMA node.
			DeviceIDs map[string][]string
		}
	}
}

// Pods reads the checkpoint: each pod's containers' devices, by pod UID. A
// missing file is no allocation at all (no device plugin has allocated).
func (c *Checkpoint) Pods() (map[string]PodDevices, error) {
	data, err := os.ReadFile(c.Path)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]PodDevices{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("the kubelet's device checkpoint: %w", err)
	}
	var cp checkpointData
	if err := json.Unmarshal(data, &cp); err != nil {
		return nil, fmt.Errorf("the kubelet's device checkpoint %s: %w", c.Path, err)
	}
	out := map[string]PodDevices{}
	for _, e := range cp.Data.PodDeviceEntries {
		if out[e.PodUID] == nil {
			out[e.PodUID] = PodDevices{}
		}
		if out[e.PodUID][e.ContainerName] == nil {
			out[e.PodUID][e.ContainerName] = map[string][]string{}
		}
		for _, ids := range e.DeviceIDs {
			out[e.PodUID][e.ContainerName][e.ResourceName] = append(out[e.PodUID][e.ContainerName][e.ResourceName], ids...)
		}
	}
	for _, pod := range out {
		for _, byResource := range pod {
			for r, ids := range byResource {
				// A device on several NUMA nodes is listed under each.
				slices.Sort(ids)
				byResource[r] = slices.Compact(ids)
			}
		}
	}
	return out, nil
}

// Container is one container's devices by resource, and whether the
// checkpoint records the container at all.
func (c *Checkpoint) Container(podUID, container string) (map[string][]string, bool, error) {
	pods, err := c.Pods()
	if err != nil {
		return nil, false, err
	}
	devices, ok := pods[podUID][container]
	return devices, ok, nil
}
