package enforcer

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/gpuguard/gpuguard/agent/discovery"
	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/policy"
)

// testNode has two whole GPUs and a third split into two MIG devices.
func testNode() *discovery.Inventory {
	return &discovery.Inventory{GPUs: []discovery.GPU{
		{Index: 0, UUID: "GPU-a", Minor: 0},
		{Index: 1, UUID: "GPU-b", Minor: 1},
		{Index: 2, UUID: "GPU-c", Minor: 2, MIGEnabled: true, MIG: []discovery.MIGDevice{
			{ParentIndex: 2, ParentUUID: "GPU-c", Index: 0, UUID: "MIG-c0"},
			{ParentIndex: 2, ParentUUID: "GPU-c", Index: 1, UUID: "MIG-c1"},
		}},
	}}
}

func testRules(t testing.TB) *Rules {
	t.Helper()
	r, err := NewRules(config.Default(), testNode())
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// gpuNodes are /dev/nvidiaN nodes of the GPUs of those minors.
func gpuNodes(minors ...int64) []Device {
	var out []Device
	for _, m := range minors {
		out = append(out, Device{Path: fmt.Sprintf("/dev/nvidia%d", m), Type: "c", Major: GPUMajor, Minor: m})
	}
	return out
}

const mountRoot = "/var/run/nvidia-container-devices"

// TestDecide: each channel of the NVIDIA runtime, with and without an
// allocation; the container ends granting exactly what was allocated.
func TestDecide(t *testing.T) {
	r := testRules(t)
	for _, tc := range []struct {
		name string
		c    Container
		f    Facts
		// want: variables set, and what is removed, by kind.
		setEnv                  map[string]string
		rmMounts, rmAnnotations []string
		refuse                  bool
	}{
		{name: "no GPU, image ENV all", c: Container{Env: []string{"PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"}},
			setEnv: map[string]string{"NVIDIA_VISIBLE_DEVICES": "void"}},
		{name: "no GPU, legacy CUDA image without the variable", c: Container{Env: []string{"CUDA_VERSION=12.4"}},
			setEnv: map[string]string{"NVIDIA_VISIBLE_DEVICES": "void"}},
		{name: "no GPU, nothing NVIDIA: untouched", c: Container{Env: []string{"PATH=/bin"}}},
		{name: "no GPU, already void: untouched", c: Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=void"}}},
		{name: "no GPU, none (driver without a GPU) becomes void", c: Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=none"}},
			setEnv: map[string]string{"NVIDIA_VISIBLE_DEVICES": "void"}},
		{name: "one GPU, env all narrowed", c: Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}},
			f: Facts{Allocated: []string{"GPU-a"}}, setEnv: map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-a"}},
		{name: "one GPU, the pod's all after the plugin's list: refused",
			c: Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=GPU-a", "NVIDIA_VISIBLE_DEVICES=all"}},
			f: Facts{Allocated: []string{"GPU-a"}}, refuse: true},
		{name: "one GPU, the image's all before the plugin's list: untouched",
			c: Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=GPU-a"}}, f: Facts{Allocated: []string{"GPU-a"}}},
		{name: "no GPU, the pod's all after the image's: refused",
			c: Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=all"}}, refuse: true},
		{name: "no GPU, admission's void after the image's all: untouched",
			c: Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=void"}}},
		{name: "one GPU by index, its own value kept", c: Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=0"}},
			f: Facts{Allocated: []string{"GPU-a"}}},
		{name: "one GPU, a neighbour's added", c: Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b"}},
			f: Facts{Allocated: []string{"GPU-a"}}, setEnv: map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-a"}},
		{name: "time-sliced share: its GPU", c: Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}},
			f: Facts{Allocated: []string{"GPU-b::3"}}, setEnv: map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-b"}},
		{name: "MIG device: itself, not its parent", c: Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=GPU-c"}},
			f: Facts{Allocated: []string{"MIG-c1"}}, setEnv: map[string]string{"NVIDIA_VISIBLE_DEVICES": "MIG-c1"}},
		{name: "MIG device by index kept", c: Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=2:1"}},
			f: Facts{Allocated: []string{"MIG-c1"}}},
		{name: "volume-mounts: the root kept, a forged mount removed",
			c: Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=" + mountRoot},
				Mounts: []Mount{{mountRoot + "/GPU-a", "/dev/null"}, {mountRoot + "/all", "/dev/null"}, {"/data", "/srv"}}},
			f: Facts{Allocated: []string{"GPU-a"}}, rmMounts: []string{mountRoot + "/all"}},
		{name: "no GPU: every device-list mount removed", c: Container{Mounts: []Mount{{mountRoot + "/GPU-a", "/dev/null"}}},
			rmMounts: []string{mountRoot + "/GPU-a"}},
		{name: "device-list root matched as a plain prefix, as the toolkit does",
			c: Container{Mounts: []Mount{{mountRoot + "all", "/dev/null"}, {mountRoot + "GPU-a", "/dev/null"}, {mountRoot + "//GPU-a/", "/dev/null"},
				{"/run/nvidia-container-devicesall", "/dev/null"}, {mountRoot, "/dev/null"}, {"/var/run/nvidia-container", "/dev/null"}}},
			f:        Facts{Allocated: []string{"GPU-a"}},
			rmMounts: []string{mountRoot + "all", "/run/nvidia-container-devicesall", mountRoot}},
		{name: "CDI annotations: the allocated kept, a forged one removed",
			c: Container{Annotations: map[string]string{"cdi.k8s.io/gpuguard-agent_x": "nvidia.com/gpu=GPU-a",
				"cdi.k8s.io/forged": "nvidia.com/gpu=all", "other": "nvidia.com/gpu=all"}},
			f: Facts{Allocated: []string{"GPU-a"}}, rmAnnotations: []string{"cdi.k8s.io/forged"}},
		{name: "device nodes: a neighbour's refused (NRI cannot remove it)",
			c: Container{Devices: gpuNodes(0, 1, 2)}, f: Facts{Allocated: []string{"MIG-c0", "GPU-a"}}, refuse: true},
		{name: "device nodes: the allocation's, a MIG parent's and the shared ones kept",
			c: Container{Devices: append(gpuNodes(0, 2), Device{"/dev/nvidiactl", "c", 195, 255})}, f: Facts{Allocated: []string{"MIG-c0", "GPU-a"}}},
		{name: "an allocation in a scheme not resolved: its device nodes left alone",
			c: Container{Devices: gpuNodes(0, 1)}, f: Facts{Allocated: []string{"GPU-a-_-0"}}},
		{name: "protected variable without a GPU removed, allowed one on a GPU kept",
			c: Container{Env: []string{"NVIDIA_MIG_CONFIG_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute"}},
			f: Facts{Allocated: []string{"GPU-a"}}, setEnv: map[string]string{"NVIDIA_MIG_CONFIG_DEVICES": ""}},
		{name: "driver capabilities without a GPU: the toolkit's default",
			c: Container{Env: []string{"NVIDIA_DRIVER_CAPABILITIES=all"}}, setEnv: map[string]string{"NVIDIA_DRIVER_CAPABILITIES": "utility,compute"}},
		{name: "driver capabilities on a GPU, a value the policy does not allow: the default",
			c: Container{Env: []string{"NVIDIA_DRIVER_CAPABILITIES=compute,everything"}}, f: Facts{Allocated: []string{"GPU-a"}},
			setEnv: map[string]string{"NVIDIA_DRIVER_CAPABILITIES": "utility,compute"}},
		{name: "feature and channel variables without a GPU: disabled and void",
			c: Container{Env: []string{"NVIDIA_MOFED=enabled", "NVIDIA_NVSWITCH=enabled", "NVIDIA_GDS=enabled", "NVIDIA_GDRCOPY=true",
				"NVIDIA_IMEX_CHANNELS=0", "NVIDIA_MIG_MONITOR_DEVICES=all", "NVIDIA_REQUIRE_JETPACK=csv-mounts=all"}},
			setEnv: map[string]string{"NVIDIA_MOFED": "disabled", "NVIDIA_NVSWITCH": "disabled", "NVIDIA_GDS": "disabled",
				"NVIDIA_GDRCOPY": "disabled", "NVIDIA_IMEX_CHANNELS": "void", "NVIDIA_MIG_MONITOR_DEVICES": "",
				"NVIDIA_REQUIRE_JETPACK": ""}},
		{name: "MOFED on a GPU container, which no workload may have: disabled",
			c: Container{Env: []string{"NVIDIA_MOFED=enabled", "NVIDIA_GDS=enabled"}}, f: Facts{Allocated: []string{"GPU-a"}},
			setEnv: map[string]string{"NVIDIA_MOFED": "disabled"}},
		{name: "protected variables already inert: untouched",
			c: Container{Env: []string{"NVIDIA_MOFED=disabled", "NVIDIA_IMEX_CHANNELS=void", "NVIDIA_MIG_CONFIG_DEVICES="}}},
		{name: "KAI fraction: its ConfigMap's list, its reservation pod's GPU, kept", c: Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=GPU-b"}},
			f: Facts{KAIFraction: true, KAIBound: []string{"GPU-b"}}},
		{name: "privileged refused", c: Container{AllDevices: true, Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}}, refuse: true},
		{name: "exempt: untouched, privileged or not",
			c: Container{AllDevices: true, Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}, Devices: gpuNodes(1)},
			f: Facts{Exempt: "namespace gpu-operator"}},
		{name: "waives inject-void, nothing allocated: the image's all kept",
			c: Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}, Devices: gpuNodes(1)},
			f: Facts{Exempt: "service account gpu-infra/dcgm", Waived: policy.RuleSet{policy.RuleInjectVoid: true}}},
		{name: "waives inject-void, one GPU: all still narrowed (device-env)",
			c:      Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}},
			f:      Facts{Allocated: []string{"GPU-a"}, Exempt: "service account gpu-infra/dcgm", Waived: policy.RuleSet{policy.RuleInjectVoid: true}},
			setEnv: map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-a"}},
		{name: "waives host paths only: privileged still refused",
			c: Container{AllDevices: true}, f: Facts{Exempt: "service account monitoring/node-exporter",
				Waived: policy.RuleSet{policy.RuleSensitiveHostPath: true}}, refuse: true},
		{name: "waives privileged only: created, and void",
			c:      Container{AllDevices: true, Env: []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_MIG_CONFIG_DEVICES=all"}},
			f:      Facts{Exempt: "service account gpu-infra/gfd", Waived: policy.RuleSet{policy.RulePrivileged: true}},
			setEnv: map[string]string{"NVIDIA_VISIBLE_DEVICES": "void", "NVIDIA_MIG_CONFIG_DEVICES": ""}},
		{name: "waives protected-env: its variables kept, void still set",
			c:      Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_MIG_CONFIG_DEVICES=all"}},
			f:      Facts{Exempt: "service account gpu-infra/mig", Waived: policy.RuleSet{policy.RuleProtectedEnv: true}},
			setEnv: map[string]string{"NVIDIA_VISIBLE_DEVICES": "void"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := r.Decide(tc.c, tc.f)
			// The plugin skips the kubelet for what nothing allocated
			// leaves alone: an allocation must never change such a container.
			if !r.NeedsAllocation(tc.c) && d.Changed() {
				t.Errorf("unchanged with nothing allocated, changed with %v: %v", tc.f, d.Changes)
			}
			if (d.Refuse != "") != tc.refuse {
				t.Fatalf("refuse = %q, want %v", d.Refuse, tc.refuse)
			}
			if tc.setEnv == nil {
				tc.setEnv = map[string]string{}
			}
			if !maps.Equal(d.SetEnv, tc.setEnv) {
				t.Errorf("set %v, want %v", d.SetEnv, tc.setEnv)
			}
			for _, c := range []struct {
				what      string
				got, want []string
			}{{"mounts", d.RemoveMounts, tc.rmMounts},
				{"annotations", d.RemoveAnnotations, tc.rmAnnotations}} {
				if !slices.Equal(c.got, c.want) {
					t.Errorf("removed %s %v, want %v", c.what, c.got, c.want)
				}
			}
			if changed := len(tc.setEnv)+len(tc.rmMounts)+len(tc.rmAnnotations) > 0 || tc.refuse; d.Changed() != changed {
				t.Errorf("Changed() = %v with changes %v", d.Changed(), d.Changes)
			}
		})
	}
}

// TestProtectedWithoutInertValue: a protected variable the policy adds,
// of which gpuguard knows no value that grants nothing, gets the container
// refused, naming it; NRI cannot remove it.
func TestProtectedWithoutInertValue(t *testing.T) {
	p := config.Default()
	p.Spec.Env.ProtectedVariables = append(p.Spec.Env.ProtectedVariables, config.ProtectedVariable{Name: "VENDOR_GRANT"})
	r, err := NewRules(p, testNode())
	if err != nil {
		t.Fatal(err)
	}
	d := r.Decide(Container{Env: []string{"VENDOR_GRANT=everything"}}, Facts{})
	if !strings.Contains(d.Refuse, "VENDOR_GRANT") || !strings.Contains(d.Refuse, "NRI cannot remove") {
		t.Errorf("refuse = %q, want it naming VENDOR_GRANT and why", d.Refuse)
	}
	if !r.NeedsAllocation(Container{Env: []string{"VENDOR_GRANT=x"}}) {
		t.Error("a container to refuse must need the allocation: a GPU may allow the variable")
	}
}

// TestNVIDIAPodAnnotations: a pod annotation from which NVIDIA's NRI plugin
// injects CDI devices (nvidia.cdi.k8s.io/container.<name>, /pod, or the
// bare key) gets the container refused where it names a device not
// allocated to it; NRI removes no pod annotation. Another container's key
// is not this container's, and an exemption waiving device-annotation
// leaves it alone. Before, each was created and the plugin injected the
// device.
func TestNVIDIAPodAnnotations(t *testing.T) {
	r := testRules(t)
	gpuA := Facts{Allocated: []string{"GPU-a"}}
	for _, tc := range []struct {
		name        string
		annotations map[string]string
		f           Facts
		refusing    string // "" where not refused
	}{
		{name: "every GPU for the container", annotations: map[string]string{"nvidia.cdi.k8s.io/container.main": "nvidia.com/gpu=all"},
			f: gpuA, refusing: "nvidia.cdi.k8s.io/container.main"},
		{name: "a neighbour's GPU for the pod", annotations: map[string]string{"nvidia.cdi.k8s.io/pod": "nvidia.com/gpu=GPU-a,nvidia.com/gpu=1"},
			f: gpuA, refusing: `"nvidia.com/gpu=1"`},
		{name: "the bare key, no GPU allocated", annotations: map[string]string{"nvidia.cdi.k8s.io": "nvidia.com/gpu=GPU-a"},
			refusing: "nvidia.cdi.k8s.io"},
		{name: "the management GPUs", annotations: map[string]string{"nvidia.cdi.k8s.io/container.main": "management.nvidia.com/gpu=all"},
			refusing: "management.nvidia.com/gpu=all"},
		{name: "its own GPU, by UUID and index", annotations: map[string]string{"nvidia.cdi.k8s.io/container.main": "nvidia.com/gpu=GPU-a,nvidia.com/gpu=0"}, f: gpuA},
		{name: "another container's key", annotations: map[string]string{"nvidia.cdi.k8s.io/container.sidecar": "nvidia.com/gpu=all"}, f: gpuA},
		{name: "waived with device-annotation", annotations: map[string]string{"nvidia.cdi.k8s.io/pod": "nvidia.com/gpu=all"},
			f: Facts{Allocated: []string{"GPU-a"}, Exempt: "service account x/y", Waived: policy.RuleSet{policy.RuleDeviceAnnotation: true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := r.Decide(Container{Name: "main", PodAnnotations: tc.annotations}, tc.f)
			switch {
			case tc.refusing == "" && d.Refuse != "":
				t.Errorf("refused: %s", d.Refuse)
			case tc.refusing != "" && !strings.Contains(d.Refuse, tc.refusing):
				t.Errorf("decision %+v, want refused naming %s", d, tc.refusing)
			}
			if tc.refusing != "" && !r.NeedsAllocation(Container{Name: "main", PodAnnotations: tc.annotations}) {
				t.Error("the container was decided without reading its allocation")
			}
		})
	}
}
