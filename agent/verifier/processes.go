package verifier

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuguard/gpuguard/agent/discovery"
)

// ProcessSource reports, for each GPU, the host PIDs of the processes that
// hold a context on it.
type ProcessSource interface {
	GPUProcesses() (map[string][]int, error)
}

// NVMLProcesses asks NVML which processes run on each full GPU (compute and
// graphics). A process on a GPU has opened it, whatever its /dev shows: this
// sees a device node that was opened and then removed, or one reached
// through a path the /dev walk does not look at.
type NVMLProcesses struct {
	Lib  nvml.Interface
	GPUs []discovery.GPU
}

// GPUProcesses lists the PIDs per GPU UUID.
func (n NVMLProcesses) GPUProcesses() (map[string][]int, error) {
	out := map[string][]int{}
	for _, g := range n.GPUs {
		h, ret := n.Lib.DeviceGetHandleByIndex(g.Index)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("NVML handle of GPU %d: %v", g.Index, ret)
		}
		compute, ret := h.GetComputeRunningProcesses()
		if ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_SUPPORTED {
			return nil, fmt.Errorf("NVML compute processes of %s: %v", g.UUID, ret)
		}
		graphics, ret := h.GetGraphicsRunningProcesses()
		if ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_SUPPORTED {
			return nil, fmt.Errorf("NVML graphics processes of %s: %v", g.UUID, ret)
		}
		for _, p := range append(compute, graphics...) {
			out[g.UUID] = append(out[g.UUID], int(p.Pid))
		}
	}
	return out, nil
}

// containerID finds a CRI container ID (64 hex digits) in a cgroup path, as
// containerd and CRI-O name their cgroups after the container's ID.
var containerID = regexp.MustCompile(`[0-9a-f]{64}`)

// containerOfPID maps a host PID to the running container whose ID its
// cgroup names; ok is false for a process outside every known container.
func containerOfPID(procRoot string, pid int, byID map[string]Container) (Container, bool, error) {
	data, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "cgroup"))
	if errors.Is(err, os.ErrNotExist) {
		return Container{}, false, nil // ended meanwhile
	}
	if err != nil {
		return Container{}, false, err
	}
	for _, id := range containerID.FindAllString(string(data), -1) {
		if c, ok := byID[id]; ok {
			return c, true, nil
		}
	}
	return Container{}, false, nil
}
