package enforcer

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	nrigen "github.com/containerd/nri/pkg/runtime-tools/generate"
	rspec "github.com/opencontainers/runtime-spec/specs-go"
	rgen "github.com/opencontainers/runtime-tools/generate"
	"sigs.k8s.io/yaml"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

// toolkitSpec is a spec like nvidia-ctk's for testNode's GPUs: each device
// by index and by UUID, with its device node, and the common edit that
// voids NVIDIA_VISIBLE_DEVICES.
func toolkitSpec() *specs.Spec {
	node := func(minor int64) specs.ContainerEdits {
		return specs.ContainerEdits{DeviceNodes: []*specs.DeviceNode{{Path: "/dev/nvidia" + string(rune('0'+minor)), Type: "c", Major: 195, Minor: minor}}}
	}
	return &specs.Spec{Version: "0.6.0", Kind: "nvidia.com/gpu",
		ContainerEdits: specs.ContainerEdits{Env: []string{"NVIDIA_VISIBLE_DEVICES=void"}},
		Devices: []specs.Device{
			{Name: "0", ContainerEdits: node(0)}, {Name: "GPU-a", ContainerEdits: node(0)},
			{Name: "1", ContainerEdits: node(1)}, {Name: "GPU-b", ContainerEdits: node(1)},
			{Name: "2:1", ContainerEdits: node(2)}, {Name: "MIG-c1", ContainerEdits: node(2)},
		}}
}

// specDir is a CDI directory holding the enforcer's void spec and, with
// toolkit, the toolkit's.
func specDir(t *testing.T, toolkit bool) string {
	t.Helper()
	dir := t.TempDir()
	if _, err := WriteVoidSpec(dir, []string{"NVIDIA_VISIBLE_DEVICES", "DOCKER_RESOURCE_GPU"}); err != nil {
		t.Fatal(err)
	}
	if toolkit {
		data, err := yaml.Marshal(toolkitSpec())
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "nvidia.yaml"), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func cdiRules(t *testing.T, dir string) *Rules {
	t.Helper()
	s, err := NewSpecDirs([]string{dir}, []string{"nvidia.com/gpu", "gpuguard.io/gpu"})
	if err != nil {
		t.Fatal(err)
	}
	return testRules(t).WithCDI(s)
}

// TestRepeatedVariablesThroughCDI: a device variable set more than once is
// narrowed through CDI where the node's specs name the allocation, and
// refused where they do not, or where it is not a device variable.
func TestRepeatedVariablesThroughCDI(t *testing.T) {
	repeated := func(values ...string) []string {
		var env []string
		for _, v := range values {
			env = append(env, "NVIDIA_VISIBLE_DEVICES="+v)
		}
		return env
	}
	for _, tc := range []struct {
		name     string
		toolkit  bool
		env      []string
		f        Facts
		want     []string
		refusing string
	}{
		{name: "no GPU, the pod's all after the image's: void", env: repeated("all", "all"), want: []string{VoidDevice}},
		{name: "one GPU, the pod's all after the plugin's list: its GPU", toolkit: true, env: repeated("all", "GPU-a", "all"),
			f: Facts{Allocated: []string{"GPU-a"}}, want: []string{VoidDevice, "nvidia.com/gpu=GPU-a"}},
		{name: "MIG device: itself", toolkit: true, env: repeated("GPU-c", "all"),
			f: Facts{Allocated: []string{"MIG-c1"}}, want: []string{VoidDevice, "nvidia.com/gpu=MIG-c1"}},
		{name: "two time-sliced shares of one GPU: the GPU once", toolkit: true, env: repeated("all", "all"),
			f: Facts{Allocated: []string{"GPU-b::0", "GPU-b::1"}}, want: []string{VoidDevice, "nvidia.com/gpu=GPU-b"}},
		{name: "a node without the toolkit's spec: refused, saying so", env: repeated("GPU-a", "all"),
			f: Facts{Allocated: []string{"GPU-a"}}, refusing: "no CDI spec in"},
		{name: "an allocation not resolved: refused", toolkit: true, env: repeated("x", "all"),
			f: Facts{Allocated: []string{"GPU-a-_-0"}}, refusing: "cannot name through CDI"},
		{name: "a protected variable to neutralise, set twice: refused", toolkit: true,
			env: []string{"NVIDIA_DRIVER_CAPABILITIES=all", "NVIDIA_DRIVER_CAPABILITIES=all"}, refusing: "cannot be changed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := cdiRules(t, specDir(t, tc.toolkit))
			if !r.NeedsAllocation(Container{Env: tc.env}) {
				t.Error("a variable to change set twice must need the allocation")
			}
			d := r.Decide(Container{Env: tc.env}, tc.f)
			if tc.refusing != "" {
				if !strings.Contains(d.Refuse, tc.refusing) {
					t.Fatalf("refuse = %q, want it saying %q", d.Refuse, tc.refusing)
				}
				return
			}
			if d.Refuse != "" || !slices.Equal(d.InjectCDI, tc.want) {
				t.Fatalf("refuse %q, inject %v; want inject %v", d.Refuse, d.InjectCDI, tc.want)
			}
			if _, set := d.SetEnv["NVIDIA_VISIBLE_DEVICES"]; set {
				t.Errorf("NVIDIA_VISIBLE_DEVICES also set through the environment: %v", d.SetEnv)
			}
		})
	}
	t.Run("a void device altered on the host: refused", func(t *testing.T) {
		dir := specDir(t, true)
		altered := VoidSpec([]string{"NVIDIA_VISIBLE_DEVICES"})
		altered.Devices[0].ContainerEdits.DeviceNodes = []*specs.DeviceNode{{Path: "/dev/nvidia1", Type: "c", Major: 195, Minor: 1}}
		data, err := yaml.Marshal(altered)
		if err != nil {
			t.Fatal(err)
		}
		matches, _ := filepath.Glob(filepath.Join(dir, "gpuguard.io-enforcer*"))
		if len(matches) != 1 {
			t.Fatalf("the void spec in %s: %v", dir, matches)
		}
		if err := os.WriteFile(matches[0], data, 0o644); err != nil {
			t.Fatal(err)
		}
		d := cdiRules(t, dir).Decide(Container{Env: repeated("GPU-a", "all")}, Facts{Allocated: []string{"GPU-a"}})
		if !strings.Contains(d.Refuse, "adds more than variables") {
			t.Fatalf("refuse = %q, inject %v", d.Refuse, d.InjectCDI)
		}
	})
	t.Run("without a CDI directory: refused", func(t *testing.T) {
		if d := testRules(t).Decide(Container{Env: repeated("all", "all")}, Facts{}); !strings.Contains(d.Refuse, "no CDI spec directory") {
			t.Fatalf("refuse = %q", d.Refuse)
		}
	})
}

// TestCDIFinalSpec applies the enforcer's adjustment as containerd does
// (NRI's spec generator with a CDI injector) to the spec containerd builds
// for a one-GPU pod whose env asks for every GPU: the image's, the device
// plugin's and the pod's values side by side. Through the environment
// alone the runtime would still read "all"; through CDI it reads void and
// the container gets its GPU's device node only.
func TestCDIFinalSpec(t *testing.T) {
	dir := specDir(t, true)
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	apply := func(d Decision) *rspec.Spec {
		spec := &rspec.Spec{Process: &rspec.Process{Env: []string{"PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all",
			"NVIDIA_VISIBLE_DEVICES=GPU-a", "NVIDIA_VISIBLE_DEVICES=all"}}, Linux: &rspec.Linux{}}
		inject := nrigen.WithCDIDeviceInjector(func(s *rspec.Spec, devices []string) error {
			if err := cache.Refresh(); err != nil {
				return err
			}
			_, err := cache.InjectDevices(s, devices...)
			return err
		})
		if err := nrigen.SpecGenerator(&rgen.Generator{Config: spec}, inject).Adjust(adjustment(d)); err != nil {
			t.Fatal(err)
		}
		return spec
	}
	read := func(s *rspec.Spec) string { // as the NVIDIA runtime reads it: the last occurrence
		v, _ := envMap(s.Process.Env)
		return v["NVIDIA_VISIBLE_DEVICES"]
	}

	envOnly := apply(Decision{SetEnv: map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-a"}})
	if got := read(envOnly); got != "all" {
		t.Fatalf("through the environment alone the runtime reads %q; this test's premise (it reads all) no longer holds", got)
	}

	d := cdiRules(t, dir).Decide(Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=GPU-a", "NVIDIA_VISIBLE_DEVICES=all"}},
		Facts{Allocated: []string{"GPU-a"}})
	if d.Refuse != "" {
		t.Fatal(d.Refuse)
	}
	final := apply(d)
	if got := read(final); got != Void {
		t.Errorf("through CDI the runtime reads NVIDIA_VISIBLE_DEVICES=%q, want void (env %v)", got, final.Process.Env)
	}
	var nodes []string
	for _, dev := range final.Linux.Devices {
		nodes = append(nodes, dev.Path)
	}
	if !slices.Equal(nodes, []string{"/dev/nvidia0"}) {
		t.Errorf("device nodes %v, want /dev/nvidia0 only", nodes)
	}
}

// TestVoidSpecIsValid: the runtime's CDI cache accepts the void spec and
// its one device sets every device variable to void.
func TestVoidSpecIsValid(t *testing.T) {
	cache, err := cdi.NewCache(cdi.WithSpecDirs(specDir(t, false)), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(cache.Refresh(), errors.Join(flatten(cache.GetErrors())...)); err != nil {
		t.Fatal(err)
	}
	dev := cache.GetDevice(VoidDevice)
	if dev == nil {
		t.Fatalf("%s not defined; devices %v", VoidDevice, cache.ListDevices())
	}
	if want := []string{"NVIDIA_VISIBLE_DEVICES=void", "DOCKER_RESOURCE_GPU=void"}; !slices.Equal(dev.ContainerEdits.Env, want) {
		t.Errorf("env edits %v, want %v", dev.ContainerEdits.Env, want)
	}
}

func flatten(m map[string][]error) []error {
	var out []error
	for _, errs := range m {
		out = append(out, errs...)
	}
	return out
}
