package verifier

import (
	"context"
	"github.com/gpuguard/gpuguard/agent/discovery/nvmlmock"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gpuguard/gpuguard/agent/discovery"
	"github.com/gpuguard/gpuguard/config"
)

// TestNVMLProcessesFindWhatDevNodesHide: a container whose /dev holds no GPU
// node but whose process NVML reports on a GPU (a node opened and removed, or
// reached elsewhere) is a finding seen by nvml-process; a process on its own
// GPU, or outside every container, is not.
func TestNVMLProcessesFindWhatDevNodesHide(t *testing.T) {
	mock, err := nvmlmock.NewNode("dgxa100", nvmlmock.Options{NodeName: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := discovery.Init(mock.Server); err != nil {
		t.Fatal(err)
	}
	inv, err := discovery.Discover(mock.Server, discovery.Options{})
	if err != nil {
		t.Fatal(err)
	}
	procRoot := t.TempDir()
	id := func(c byte) string { return strings.Repeat(string(c), 64) }
	hidden := Container{ID: id('a'), Key: key("team-a", "hidden", "main"), PID: 301}
	owner := Container{ID: id('b'), Key: key("team-a", "train", "main"), PID: 302}
	for _, c := range []Container{hidden, owner} {
		writeProc(t, procRoot, c.PID, "0::/kubepods.slice/kubepods-besteffort.slice/cri-containerd-"+c.ID+".scope\n")
	}
	writeProc(t, procRoot, 303, "0::/system.slice/sshd.service\n") // a host process
	mock.SetProcesses(2, 301, 303)
	mock.SetProcesses(5, 302)

	pol := config.Default()
	v := &Verifier{Containers: fakeContainers{hidden, owner},
		Allocations: fakeAllocations{owner.Key: {"nvidia.com/gpu": {inv.GPUs[5].UUID}}},
		Table:       NewDeviceTable(inv), Resolver: NewGPUResolver(inv), IsGPUResource: pol.Spec.IsGPUResource,
		ProcRoot: procRoot, Processes: NVMLProcesses{Lib: mock.Server, GPUs: inv.GPUs}}
	p, err := v.Check(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Findings) != 1 {
		t.Fatalf("findings %+v, want one: the hidden container on GPU 2", p.Findings)
	}
	f := p.Findings[0]
	if f.Container.Key != hidden.Key || f.GPU.UUID != inv.GPUs[2].UUID || f.SeenBy != SeenByNVMLProcess || f.GPU.Path != "pid 301" {
		t.Errorf("finding %+v", f)
	}
	got, err := NVMLProcesses{Lib: mock.Server, GPUs: inv.GPUs}.GPUProcesses()
	if err != nil || !slices.Equal(got[inv.GPUs[2].UUID], []int{301, 303}) {
		t.Errorf("NVML processes %v, %v", got, err)
	}
}

func writeProc(t *testing.T, procRoot string, pid int, cgroup string) {
	t.Helper()
	dir := filepath.Join(procRoot, strconv.Itoa(pid))
	if err := os.MkdirAll(filepath.Join(dir, "root", "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cgroup), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestAddSeenCombines(t *testing.T) {
	list := []Reached{{UUID: "GPU-1", Path: "/dev/nvidia1", SeenBy: SeenByDeviceNode}}
	list = addSeen(list, Reached{UUID: "GPU-1", Path: "pid 7"}, SeenByNVMLProcess)
	list = addSeen(list, Reached{UUID: "GPU-1", Path: "pid 8"}, SeenByNVMLProcess)
	list = addSeen(list, Reached{UUID: "GPU-2", Path: "pid 9"}, SeenByNVMLProcess)
	if len(list) != 2 || list[0].SeenBy != "device-node,nvml-process" || list[0].Path != "/dev/nvidia1" || list[1].SeenBy != SeenByNVMLProcess {
		t.Errorf("reached %+v", list)
	}
}
