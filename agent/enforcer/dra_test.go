package enforcer

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/gpuguard/gpuguard/agent/verifier"
)

// claimUID is the UID of the DRA claims below; the GPU driver names its
// CDI devices k8s.gpu.nvidia.com/claim=<claim UID>-<device>.
const claimUID = "6f1c0a52-3d1e-4b7a-9a55-2f8f5b0d7c11"

// claimOf are the facts of a container whose DRA claim holds devices of
// driver, with the CDI devices the kubelet hands the runtime for them.
func claimOf(driver string, devices ...string) Facts {
	f := Facts{}
	for _, d := range devices {
		f.Claimed = append(f.Claimed, ClaimedDevice{Driver: driver, Device: d})
		f.ClaimedCDI = append(f.ClaimedCDI, "k8s."+driver+"/claim="+claimUID+"-"+d)
	}
	return f
}

// draContainer is what the runtime shows of a container whose claim holds
// gpu-1 (GPU-b, minor 1), the DRA driver's CDI spec applied by the
// runtime before NRI sees it: the claimed GPU's node, the driver's shared
// nodes, NVIDIA_VISIBLE_DEVICES=void from the spec's common edits.
func draContainer(more ...Device) Container {
	return Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=void"},
		Devices: append(append(gpuNodes(1), Device{"/dev/nvidiactl", "c", GPUMajor, ctlMinor}), more...)}
}

// TestDecideDRAClaims: a DRA claim of NVIDIA's GPU driver is a grant, as
// an allocation is: the claimed GPU's device node, CDI devices and names
// are kept, and anything beyond them, by variable, CDI request or device
// node, is narrowed or refused, beside the legitimate neighbour.
func TestDecideDRAClaims(t *testing.T) {
	r := testRules(t)
	gpuClaim := claimOf("gpu.nvidia.com", "gpu-1")
	for _, tc := range []struct {
		name          string
		c             Container
		f             Facts
		setEnv        map[string]string
		rmAnnotations []string
		refuse        string
	}{
		{name: "claimed GPU: its node, the shared nodes and void kept", c: draContainer(), f: gpuClaim},
		{name: "claimed GPU, a second GPU's node: refused", c: draContainer(gpuNodes(0)...), f: gpuClaim, refuse: "/dev/nvidia0"},
		{name: "claimed GPU, the second GPU's numbers under another path: refused",
			c: draContainer(Device{"/dev/gpu-x", "c", GPUMajor, 2}), f: gpuClaim, refuse: "/dev/gpu-x"},
		{name: "claimed GPU, a cgroup rule for every GPU: refused",
			c: func() Container {
				c := draContainer()
				c.DeviceRules = []DeviceRule{{Allow: true, Type: "c", Major: i64(GPUMajor), Access: "rwm"}}
				return c
			}(), f: gpuClaim, refuse: "c 195:* rwm"},
		{name: "claimed GPU, a second GPU by variable: void",
			c: Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=GPU-a"}, Devices: gpuNodes(1)}, f: gpuClaim,
			setEnv: map[string]string{"NVIDIA_VISIBLE_DEVICES": Void}},
		{name: "claimed GPU, all by variable: void",
			c: Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}, Devices: gpuNodes(1)}, f: gpuClaim,
			setEnv: map[string]string{"NVIDIA_VISIBLE_DEVICES": Void}},
		{name: "claimed GPU named by its own UUID: kept",
			c: Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=GPU-b"}, Devices: gpuNodes(1)}, f: gpuClaim},
		{name: "claimed GPU, its own CDI device kept, another GPU's by annotation removed",
			c: Container{Devices: gpuNodes(1), Annotations: map[string]string{
				"cdi.k8s.io/own":    "k8s.gpu.nvidia.com/claim=" + claimUID + "-gpu-1",
				"cdi.k8s.io/forged": "k8s.device-plugin.nvidia.com/gpu=GPU-a"}},
			f: gpuClaim, rmAnnotations: []string{"cdi.k8s.io/forged"}},
		{name: "claimed GPU, another claim's CDI device by annotation removed",
			c: Container{Devices: gpuNodes(1), Annotations: map[string]string{
				"cdi.k8s.io/forged": "k8s.gpu.nvidia.com/claim=00000000-0000-0000-0000-000000000000-gpu-0"}},
			f: gpuClaim, rmAnnotations: []string{"cdi.k8s.io/forged"}},
		{name: "claimed GPU, a second GPU through NVIDIA's NRI injector: refused",
			c: Container{Name: "main", Devices: gpuNodes(1), PodAnnotations: map[string]string{
				NVIDIACDIAnnotation + "/container.main": "k8s.device-plugin.nvidia.com/gpu=GPU-a"}},
			f: gpuClaim, refuse: NVIDIACDIAnnotation + "/container.main"},
		{name: "claimed MIG device: its parent's node and MIG capability kept",
			c: Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=void"},
				Devices: append(gpuNodes(2), Device{"/dev/nvidia-caps/nvidia-cap21", "c", 511, 21})},
			f: claimOf("gpu.nvidia.com", "gpu-2-mig-1g5gb-19-0")},
		{name: "claimed MIG device, its parent by variable: void",
			c: Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=GPU-c"}, Devices: gpuNodes(2)},
			f: claimOf("gpu.nvidia.com", "gpu-2-mig-1g5gb-19-0"), setEnv: map[string]string{"NVIDIA_VISIBLE_DEVICES": Void}},
		{name: "claimed passthrough GPU: no NVIDIA GPU node",
			c: Container{Devices: gpuNodes(0)}, f: claimOf("gpu.nvidia.com", "gpu-vfio-0"), refuse: "/dev/nvidia0"},
		{name: "claimed GPU of a minor the node lacks: no GPU node",
			c: Container{Devices: gpuNodes(7)}, f: claimOf("gpu.nvidia.com", "gpu-7"), refuse: "/dev/nvidia7"},
		{name: "compute-domain channel: the channel node kept",
			c: Container{Devices: []Device{{"/dev/nvidia-caps-imex-channels/channel0", "c", 234, 0}}},
			f: claimOf("compute-domain.nvidia.com", "channel-0")},
		{name: "compute-domain channel, a GPU named like one: refused",
			c: Container{Devices: gpuNodes(0)}, f: claimOf("compute-domain.nvidia.com", "gpu-0"), refuse: "/dev/nvidia0"},
		{name: "neighbour with a device plugin's GPU: unchanged",
			c: Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=GPU-a"}, Devices: gpuNodes(0)}, f: Facts{Allocated: []string{"GPU-a"}}},
		{name: "neighbour without claim or allocation, the claimed GPU's node: refused",
			c: Container{Devices: gpuNodes(1)}, refuse: "/dev/nvidia1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := r.Decide(tc.c, tc.f)
			if tc.refuse != "" {
				if !strings.Contains(d.Refuse, tc.refuse) {
					t.Fatalf("refusal %q, want one naming %q", d.Refuse, tc.refuse)
				}
				return
			}
			if d.Refuse != "" {
				t.Fatalf("refused: %s", d.Refuse)
			}
			if want := tc.setEnv; !maps.Equal(d.SetEnv, want) && (len(d.SetEnv) > 0 || len(want) > 0) {
				t.Errorf("set %v, want %v", d.SetEnv, want)
			}
			if !slices.Equal(d.RemoveAnnotations, tc.rmAnnotations) {
				t.Errorf("removed annotations %v, want %v", d.RemoveAnnotations, tc.rmAnnotations)
			}
			if len(d.InjectCDI) > 0 {
				t.Errorf("injected %v: a claim's devices come from the DRA driver's spec", d.InjectCDI)
			}
		})
	}
}

// TestDRAClaimsThroughNRI: what PodResources reports of a container's DRA
// claims reaches the decision: through NRI's runtime side, a container
// keeps the node of the GPU its claim holds, and is refused a second one.
func TestDRAClaimsThroughNRI(t *testing.T) {
	r, socket := startRuntime(t)
	startEnforcerWith(t, socket, fixedAllocations{{Namespace: "team-a", Pod: "train", Container: "main"}: {
		verifier.DRAResourcePrefix + "gpu.nvidia.com":    {"gpu-1"},
		verifier.DRACDIResourcePrefix + "gpu.nvidia.com": {"k8s.gpu.nvidia.com/claim=" + claimUID + "-gpu-1"}}})
	waitAdjusted(t, r, createRequest("warmup", "main", "NVIDIA_VISIBLE_DEVICES=all"))
	withNodes := func(minors ...int64) *api.CreateContainerRequest {
		req := createRequest("train", "main", "NVIDIA_VISIBLE_DEVICES=void")
		req.Container.Linux = &api.LinuxContainer{}
		for _, d := range gpuNodes(minors...) {
			req.Container.Linux.Devices = append(req.Container.Linux.Devices, &api.LinuxDevice{Path: d.Path, Type: d.Type, Major: d.Major, Minor: d.Minor})
		}
		return req
	}
	if _, err := finalSpec(t, r, withNodes(1)); err != nil {
		t.Errorf("the claimed GPU's node: %v", err)
	}
	if _, err := finalSpec(t, r, withNodes(1, 0)); err == nil || !strings.Contains(err.Error(), "/dev/nvidia0") {
		t.Errorf("a second GPU's node beside the claimed one: %v, want refused naming /dev/nvidia0", err)
	}
}
