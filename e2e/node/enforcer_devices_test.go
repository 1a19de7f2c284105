//go:build e2e

package node

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/gpuguard/gpuguard/e2e/framework/kubenode"
)

// testEnforcedProtectedEnv: a pod without a GPU limit whose env sets
// variables that grant devices or driver features runs with values that
// grant nothing. NRI v0.11 passes on no removal of a variable the
// container already has: removed, they stayed as the pod set them.
func testEnforcedProtectedEnv(t *testing.T) {
	logEnforcerOnFailure(t)
	p := probePod("enforced-protected-env")
	// Variables the image does not set: one set twice (the probe image's
	// NVIDIA_DRIVER_CAPABILITIES and the pod's) cannot be changed at the
	// node, and gets the container refused instead (TestDecide).
	for k, v := range map[string]string{"NVIDIA_MOFED": "enabled", "NVIDIA_NVSWITCH": "enabled", "NVIDIA_IMEX_CHANNELS": "0"} {
		withEnv(p, k, v)
	}
	report, _ := probe(t, tenantNS, p)
	expectGPUs(t, report, nil)
	want := map[string]string{"NVIDIA_MOFED": "disabled", "NVIDIA_NVSWITCH": "disabled", "NVIDIA_IMEX_CHANNELS": "void",
		"NVIDIA_VISIBLE_DEVICES": "void"}
	for k, v := range want {
		if got, ok := report.Env[k]; !ok || got != v {
			t.Errorf("the container ran with %s=%q (set: %v), want %q", k, got, ok, v)
		}
	}
}

// testEnforcedDeviceByNumber: a container given a GPU's device node under
// another path (/dev/gpu-b, the host's 195:<minor>) through the CRI, in a
// pod with no GPU allocated, is refused, the node named: NRI can remove no
// device node the runtime put in the spec.
func testEnforcedDeviceByNumber(t *testing.T) {
	logEnforcerOnFailure(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, stop, err := startHeldSandbox(ctx, "enforced-device-number", "device-number-logs")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	gpu := s.node.GPUs[len(s.node.GPUs)-1]
	id, err := sb.runtime.CreateContainer(ctx, sb.id, &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: "gpu-b"},
		Image:    &runtimeapi.ImageSpec{Image: kubenode.ProbeImage},
		LogPath:  "gpu-b.log",
		Devices:  []*runtimeapi.Device{{ContainerPath: "/dev/gpu-b", HostPath: gpu.Node, Permissions: "rw"}},
	}, sb.config)
	if id != "" {
		_ = sb.runtime.RemoveContainer(ctx, id)
	}
	if err == nil || !strings.Contains(err.Error(), "gpuguard") || !strings.Contains(err.Error(), "/dev/gpu-b") {
		t.Errorf("a container with %s as /dev/gpu-b: %v, want refused by gpuguard naming /dev/gpu-b", gpu.Node, err)
	}
}

// wildcardRule is an NRI plugin ordered before the enforcer, as a device
// injector is, that gives containers named wildcard-rule a device cgroup
// rule allowing every minor of the GPU major.
type wildcardRule struct{}

func (wildcardRule) CreateContainer(_ context.Context, _ *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	if ctr.GetName() != "wildcard-rule" {
		return nil, nil, nil
	}
	rule := &api.LinuxDeviceCgroup{Allow: true, Type: "c", Major: api.Int64(195), Access: "rwm"}
	return &api.ContainerAdjustment{Linux: &api.LinuxContainerAdjustment{Resources: &api.LinuxResources{Devices: []*api.LinuxDeviceCgroup{rule}}}}, nil, nil
}

// testEnforcedWildcardRule: a device cgroup rule allowing every minor of
// major 195 (with which a root container makes any GPU's node) gets the
// container refused, the rule named: no NRI plugin can remove a rule.
func testEnforcedWildcardRule(t *testing.T) {
	logEnforcerOnFailure(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	plugin, err := stub.New(wildcardRule{}, stub.WithPluginName("wildcard-rule"), stub.WithPluginIdx("10"),
		stub.WithSocketPath(s.node.NRISocket()), stub.WithOnClose(func() {}))
	if err != nil {
		t.Fatal(err)
	}
	if err := plugin.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer plugin.Stop()
	sb, stop, err := startHeldSandbox(ctx, "enforced-wildcard-rule", "wildcard-rule-logs")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	id, err := sb.create(ctx, "wildcard-rule", kubenode.ProbeImage)
	if id != "" {
		_ = sb.runtime.RemoveContainer(ctx, id)
	}
	if err == nil || !strings.Contains(err.Error(), "gpuguard") || !strings.Contains(err.Error(), "c 195:* rwm") {
		t.Errorf("a container whose cgroup allows c 195:* rwm: %v, want refused by gpuguard naming the rule", err)
	}
}

// laterGrant is an NRI plugin ordered after the enforcer (index 95), which
// the enforcer's CreateContainer never sees, that gives containers named
// greedy a GPU's device node, that GPU as a CDI device, and
// NVIDIA_VISIBLE_DEVICES=all.
type laterGrant struct {
	gpu          kubenode.FakeGPU
	major, minor int64
}

func (l laterGrant) CreateContainer(_ context.Context, _ *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	if ctr.GetName() != "greedy" {
		return nil, nil, nil
	}
	adj := &api.ContainerAdjustment{}
	adj.AddDevice(&api.LinuxDevice{Path: "/dev/greedy-gpu", Type: "c", Major: l.major, Minor: l.minor})
	adj.AddCDIDevice(&api.CDIDevice{Name: kubenode.CDIKind + "=" + l.gpu.UUID})
	adj.AddEnv("NVIDIA_VISIBLE_DEVICES", "all")
	return adj, nil, nil
}

// testEnforcedLaterPlugin: a plugin registered after the enforcer grants a
// container without a GPU a GPU's device node, a CDI device and a device
// variable; the enforcer, validating the adjustment merged from every
// plugin, gets the container refused. A one-GPU pod created beside it,
// which the plugin leaves alone, keeps exactly its own GPU.
func testEnforcedLaterPlugin(t *testing.T) {
	logEnforcerOnFailure(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	gpu := s.node.GPUs[len(s.node.GPUs)-1]
	var st unix.Stat_t
	if err := unix.Stat(gpu.Node, &st); err != nil {
		t.Fatal(err)
	}
	plugin, err := stub.New(laterGrant{gpu: gpu, major: int64(unix.Major(st.Rdev)), minor: int64(unix.Minor(st.Rdev))},
		stub.WithPluginName("later-grant"), stub.WithPluginIdx("95"), stub.WithSocketPath(s.node.NRISocket()), stub.WithOnClose(func() {}))
	if err != nil {
		t.Fatal(err)
	}
	if err := plugin.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer plugin.Stop()
	sb, stop, err := startHeldSandbox(ctx, "enforced-later-plugin", "later-plugin-logs")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	id, err := sb.create(ctx, "greedy", kubenode.ProbeImage)
	if id != "" {
		_ = sb.runtime.RemoveContainer(ctx, id)
	}
	if err == nil || !strings.Contains(err.Error(), "gpuguard") {
		t.Errorf("a container a later plugin gave a GPU node, a CDI device and NVIDIA_VISIBLE_DEVICES=all: %v, want refused by gpuguard", err)
	}
	report, pod := probe(t, tenantNS, gpuPod("enforced-beside-later-plugin"))
	expectAllocatedOnly(t, report, pod)
}
