package framework

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

// MockSystem is the agent's mock backend the node runs (8 GPUs).
const MockSystem = "dgxa100"

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

// mockGPU is a GPU as the agent's mock backend reports it.
type mockGPU struct {
	Index int    `json:"index"`
	UUID  string `json:"uuid"`
	Minor int    `json:"minor"`
}

// MockGPUs asks the agent which GPUs its mock backend has on node: it runs
// it once without its device plugin and reads the per-GPU log lines (-v 1).
// The agent's discovery is not imported: NVML's cgo bindings would tie the
// test binary to symbols only the driver's library has.
func MockGPUs(ctx context.Context, agent, node, scratch string) ([]mockGPU, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, agent, "--backend", "mock:"+MockSystem, "--node-name", node,
		"--device-plugin", "off", "--device-plugin-dir", scratch, "--metrics-addr", "", "--log-level", "debug")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	// Killed once the GPUs are read: it would keep reporting.
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var gpus []mockGPU
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		var line struct {
			Msg string `json:"msg"`
			mockGPU
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "GPU" {
			gpus = append(gpus, line.mockGPU)
		}
		if strings.Contains(sc.Text(), "node hardening report") {
			break
		}
	}
	if len(gpus) == 0 {
		return nil, fmt.Errorf("the agent reported no mock GPUs (%v)", sc.Err())
	}
	return gpus, nil
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
// each GPU by index and by UUID, "all", and common edits with the control
// nodes and NVIDIA_VISIBLE_DEVICES=void (as nvidia-ctk writes it), so a
// container that gets devices through CDI is not given more by the runtime.
func WriteCDISpec(dir, devDir string, gpus []FakeGPU) error {
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
