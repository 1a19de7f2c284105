package strategy

import (
	"testing"
)

var devs = []DeviceRef{
	{UUID: "GPU-aaaaaaaa-0000-0000-0000-000000000001", Index: "1"},
	{UUID: "MIG-bbbbbbbb-0000-0000-0000-000000000002", Index: "0:3"},
}

func build(t *testing.T, list string, ids IDStrategy) *Builder {
	t.Helper()
	l, err := Parse(list)
	if err != nil {
		t.Fatal(err)
	}
	return &Builder{Strategies: l, IDs: ids, CDIKind: "nvidia.com/gpu", NewAllocationID: func() string { return "x1" }}
}

func TestEnvVarResponse(t *testing.T) {
	r, err := build(t, "envvar", IDUUID).Build(devs)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Envs[VisibleDevicesEnv]; got != devs[0].UUID+","+devs[1].UUID {
		t.Errorf("env %q", got)
	}
	if len(r.Mounts)+len(r.Annotations)+len(r.CdiDevices)+len(r.Devices) != 0 {
		t.Errorf("unexpected extras: %v", r)
	}
	r, _ = build(t, "envvar", IDIndex).Build(devs)
	if got := r.Envs[VisibleDevicesEnv]; got != "1,0:3" {
		t.Errorf("index env %q", got)
	}
}

func TestVolumeMountsResponse(t *testing.T) {
	r, err := build(t, "volume-mounts", IDIndex).Build(devs)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Envs[VisibleDevicesEnv]; got != VolumeMountRoot || len(r.Envs) != 1 {
		t.Errorf("envs %v", r.Envs)
	}
	want := []string{VolumeMountRoot + "/1", VolumeMountRoot + "/0:3"}
	if len(r.Mounts) != 2 {
		t.Fatalf("mounts %v", r.Mounts)
	}
	for i, m := range r.Mounts {
		if m.HostPath != "/dev/null" || m.ContainerPath != want[i] {
			t.Errorf("mount %d: %v", i, m)
		}
	}
}

func TestCDIAnnotationsResponse(t *testing.T) {
	r, err := build(t, "cdi-annotations", IDUUID).Build(devs)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Envs) != 0 {
		t.Errorf("only-CDI must not set env: %v", r.Envs)
	}
	want := "nvidia.com/gpu=" + devs[0].UUID + ",nvidia.com/gpu=" + devs[1].UUID
	if got := r.Annotations["cdi.k8s.io/gpuguard-agent_x1"]; got != want || len(r.Annotations) != 1 {
		t.Errorf("annotations %v", r.Annotations)
	}
	b := build(t, "cdi-annotations", IDIndex)
	b.AnnotationPrefix = "nvidia.cdi.k8s.io/"
	r, _ = b.Build(devs)
	if got := r.Annotations["nvidia.cdi.k8s.io/gpuguard-agent_x1"]; got != "nvidia.com/gpu=1,nvidia.com/gpu=0:3" {
		t.Errorf("custom prefix: %v", r.Annotations)
	}
}

func TestCDIAnnotationKeysAreUnique(t *testing.T) {
	l, _ := Parse("cdi-annotations")
	b := &Builder{Strategies: l, IDs: IDUUID, CDIKind: "nvidia.com/gpu"}
	r1, _ := b.Build(devs[:1])
	r2, _ := b.Build(devs[:1])
	for k := range r1.Annotations {
		if _, dup := r2.Annotations[k]; dup {
			t.Fatalf("two allocations share annotation key %s", k)
		}
	}
}

func TestCDICRIResponse(t *testing.T) {
	r, err := build(t, "cdi-cri", IDIndex).Build(devs)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.CdiDevices) != 2 || r.CdiDevices[0].Name != "nvidia.com/gpu=1" || r.CdiDevices[1].Name != "nvidia.com/gpu=0:3" {
		t.Errorf("CDI devices %v", r.CdiDevices)
	}
	if len(r.Envs)+len(r.Annotations) != 0 {
		t.Errorf("extras %v", r)
	}
}

func TestCombinedResponse(t *testing.T) {
	r, err := build(t, "envvar,cdi-annotations,cdi-cri", IDUUID).Build(devs[:1])
	if err != nil {
		t.Fatal(err)
	}
	if r.Envs[VisibleDevicesEnv] != devs[0].UUID || len(r.Annotations) != 1 || len(r.CdiDevices) != 1 {
		t.Errorf("%v", r)
	}
}

func TestBuildErrors(t *testing.T) {
	if _, err := build(t, "envvar", IDUUID).Build(nil); err == nil {
		t.Error("no devices: no error")
	}
	if _, err := build(t, "envvar", IDIndex).Build([]DeviceRef{{UUID: "GPU-x"}}); err == nil {
		t.Error("missing index: no error")
	}
	b := build(t, "cdi-cri", IDUUID)
	b.CDIKind = ""
	if _, err := b.Build(devs); err == nil {
		t.Error("CDI without kind: no error")
	}
	b = build(t, "cdi-annotations", IDUUID)
	b.CDIKind = "not a kind"
	if _, err := b.Build(devs); err == nil {
		t.Error("bad CDI kind: no error")
	}
	if _, err := ParseIDStrategy("serial"); err == nil {
		t.Error("bad id strategy: no error")
	}
}
