package kubenode

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

// MockSystem is the agent's mock backend the node runs (8 GPUs), and
// MockMIGBackend the same with MIG on GPUs 0 and 1, for NodeProfile.MIG.
const (
	MockSystem     = "dgxa100"
	MockMIGBackend = "mock:" + MockSystem + ":mig"
)

// CDIKind is the kind of the harness's CDI spec: the toolkit's default kind,
// the one `nvidia-ctk cdi generate` writes and the runtime qualifies bare
// device IDs with.
const CDIKind = "nvidia.com/gpu"

// FakeGPU is one of the node's GPUs: the agent's mock device and the
// character device that stands for it.
type FakeGPU struct {
	Index int
	UUID  string
	// Node is the host path of the device node; containers see it as
	// /dev/nvidia<Minor>.
	Node      string
	Container string
}

// FakeMIG is a MIG device of one of the node's GPUs, on the MIG backend:
// containers see its parent's device node.
type FakeMIG struct {
	// ID is its nvidia-smi index, "<gpu>:<mig>".
	ID, UUID string
	Parent   FakeGPU
}

// mockGPU is a GPU as the agent's mock backend reports it.
type mockGPU struct {
	Index int    `json:"index"`
	UUID  string `json:"uuid"`
	Minor int    `json:"minor"`
}

// mockMIG is a MIG device as the agent's mock backend reports it.
type mockMIG struct {
	Index string `json:"index"`
	UUID  string `json:"uuid"`
}

// MockGPUs asks the agent which GPUs its mock backend has on node: it runs
// it once without its device plugin and reads the per-GPU log lines (-v 1).
// The agent's discovery is not imported: NVML's cgo bindings would tie the
// test binary to symbols only the driver's library has.
func MockGPUs(ctx context.Context, agent, node, scratch string) ([]mockGPU, error) {
	gpus, _, err := mockDevices(ctx, agent, "mock:"+MockSystem, node, scratch)
	return gpus, err
}

// MockMIGs are the MIG devices of the MIG backend on node, each with its
// parent among gpus.
func MockMIGs(ctx context.Context, agent, node, scratch string, gpus []FakeGPU) ([]FakeMIG, error) {
	_, migs, err := mockDevices(ctx, agent, MockMIGBackend, node, scratch)
	if err != nil {
		return nil, err
	}
	var out []FakeMIG
	for _, m := range migs {
		parent, _, _ := strings.Cut(m.Index, ":")
		i, err := strconv.Atoi(parent)
		if err != nil || i >= len(gpus) {
			return nil, fmt.Errorf("MIG device %s: no parent GPU %q among %d", m.UUID, parent, len(gpus))
		}
		out = append(out, FakeMIG{ID: m.Index, UUID: m.UUID, Parent: gpus[i]})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("the agent's %s backend reported no MIG devices", MockMIGBackend)
	}
	return out, nil
}

func mockDevices(ctx context.Context, agent, backend, node, scratch string) ([]mockGPU, []mockMIG, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, agent, "--backend", backend, "--node-name", node,
		"--device-plugin", "off", "--device-plugin-dir", scratch, "--metrics-addr", "", "--log-level", "debug")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	// Killed once the GPUs are read: it would keep reporting.
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var gpus []mockGPU
	var migs []mockMIG
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		var line struct {
			Msg string `json:"msg"`
		}
		if json.Unmarshal(sc.Bytes(), &line) != nil {
			continue
		}
		switch line.Msg {
		case "GPU":
			var g mockGPU
			if json.Unmarshal(sc.Bytes(), &g) == nil {
				gpus = append(gpus, g)
			}
		case "MIG device":
			var m mockMIG
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				migs = append(migs, m)
			}
		}
		if strings.Contains(sc.Text(), "node hardening report") {
			break
		}
	}
	if len(gpus) == 0 {
		return nil, nil, fmt.Errorf("the agent reported no mock GPUs (%v)", sc.Err())
	}
	return gpus, migs, nil
}

// controlNodes are the driver's node-wide devices, which a real CDI spec
// gives every GPU container.
var controlNodes = []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}

// nvidiaMajor is the NVIDIA driver's character-device major number.
const nvidiaMajor = 195

// MakeFakeGPUs creates a character device per GPU in devDir with a real GPU
// node's numbers (195:<minor>), and per control node with the null device's.
// No driver answers to 195 here, so opening a GPU node fails (ENXIO) and is
// harmless; the runtime, runc and the agent's verifier, which match devices
// by their numbers, handle them exactly like real GPU nodes.
func MakeFakeGPUs(devDir string, gpus []mockGPU) ([]FakeGPU, error) {
	if err := os.MkdirAll(devDir, 0o755); err != nil {
		return nil, err
	}
	var out []FakeGPU
	for _, g := range gpus {
		name := "nvidia" + strconv.Itoa(g.Minor)
		out = append(out, FakeGPU{Index: g.Index, UUID: g.UUID, Node: filepath.Join(devDir, name), Container: "/dev/" + name})
	}
	for i, f := range out {
		if err := mknod(f.Node, nvidiaMajor, uint32(gpus[i].Minor)); err != nil {
			return nil, err
		}
	}
	for _, name := range controlNodes {
		if err := mknodNull(filepath.Join(devDir, name)); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func mknodNull(path string) error { return mknod(path, 1, 3) }

func mknod(path string, major, minor uint32) error {
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return err
	}
	if err := unix.Mknod(path, unix.S_IFCHR|0o666, int(unix.Mkdev(major, minor))); err != nil {
		return fmt.Errorf("mknod %s: %w", path, err)
	}
	return nil
}

// MknodAllowed reports whether this process may create device nodes in dir,
// which the node suite needs for its fake GPUs.
func MknodAllowed(dir string) error {
	probe := filepath.Join(dir, "mknod-probe")
	defer os.Remove(probe)
	return mknodNull(probe)
}

// WriteCDISpec writes the toolkit-style spec for the fake GPUs into dir:
// each GPU and MIG device by index and by UUID (a MIG device with its
// parent's node), "all", and common edits with the control nodes and
// NVIDIA_VISIBLE_DEVICES=void (as nvidia-ctk writes it), so a container
// that gets devices through CDI is not given more by the runtime.
func WriteCDISpec(dir, devDir string, gpus []FakeGPU, migs []FakeMIG) error {
	node := func(container, host string) *specs.DeviceNode {
		return &specs.DeviceNode{Path: container, HostPath: host}
	}
	spec := specs.Spec{Version: "0.6.0", Kind: CDIKind}
	for _, name := range controlNodes {
		spec.ContainerEdits.DeviceNodes = append(spec.ContainerEdits.DeviceNodes, node("/dev/"+name, filepath.Join(devDir, name)))
	}
	spec.ContainerEdits.Env = []string{"NVIDIA_VISIBLE_DEVICES=void"}
	var all specs.ContainerEdits
	for _, g := range gpus {
		edits := specs.ContainerEdits{DeviceNodes: []*specs.DeviceNode{node(g.Container, g.Node)}}
		all.DeviceNodes = append(all.DeviceNodes, edits.DeviceNodes...)
		spec.Devices = append(spec.Devices,
			specs.Device{Name: strconv.Itoa(g.Index), ContainerEdits: edits},
			specs.Device{Name: g.UUID, ContainerEdits: edits})
	}
	for _, m := range migs {
		edits := specs.ContainerEdits{DeviceNodes: []*specs.DeviceNode{node(m.Parent.Container, m.Parent.Node)}}
		spec.Devices = append(spec.Devices, specs.Device{Name: m.ID, ContainerEdits: edits}, specs.Device{Name: m.UUID, ContainerEdits: edits})
	}
	spec.Devices = append(spec.Devices, specs.Device{Name: "all", ContainerEdits: all})
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "nvidia.json"), data, 0o644)
}
