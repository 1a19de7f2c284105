package cdispec

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gpuguard/gpuguard/agent/discovery"
	"github.com/gpuguard/gpuguard/agent/discovery/discoverytest"
	"github.com/gpuguard/gpuguard/internal/wellknown"
)

func inventory(t *testing.T, spec string) *discovery.Inventory {
	return discoverytest.Inventory(t, spec)
}

// toolkitSpec writes a spec like 'nvidia-ctk cdi generate' with index names.
func toolkitSpec(t *testing.T, n int) string {
	t.Helper()
	dir := t.TempDir()
	var b strings.Builder
	b.WriteString("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n")
	for i := 0; i < n; i++ {
		b.WriteString("- name: \"" + strconv.Itoa(i) + "\"\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia" + strconv.Itoa(i) + "\n")
	}
	b.WriteString("containerEdits:\n  env:\n  - NVIDIA_VISIBLE_DEVICES=void\n")
	if err := os.WriteFile(filepath.Join(dir, "nvidia.yaml"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func indexIDs(n int) []string {
	var ids []string
	for i := 0; i < n; i++ {
		ids = append(ids, strconv.Itoa(i))
	}
	return ids
}

func TestToolkitSpecIsUsedWhenComplete(t *testing.T) {
	inv := inventory(t, "mock:dgxa100")
	dir := toolkitSpec(t, 8)
	for _, mode := range []string{ModeAuto, ModeToolkit} {
		r, err := Ensure(Config{Mode: mode, SpecDirs: []string{dir}, WriteDir: t.TempDir()}, inv, indexIDs(8))
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		if r.Source != "toolkit" || r.Kind != "nvidia.com/gpu" {
			t.Fatalf("%s: %+v", mode, r)
		}
	}
}

func TestMissingToolkitNames(t *testing.T) {
	inv := inventory(t, "mock:dgxa100")
	dir := toolkitSpec(t, 6) // GPUs 6 and 7 missing
	_, err := Ensure(Config{Mode: ModeToolkit, SpecDirs: []string{dir}}, inv, indexIDs(8))
	if err == nil || !strings.Contains(err.Error(), "nvidia.com/gpu=6") || !strings.Contains(err.Error(), "nvidia-ctk cdi generate") {
		t.Fatalf("got %v", err)
	}
	uuids := []string{inv.GPUs[0].UUID}
	if _, err := Ensure(Config{Mode: ModeToolkit, SpecDirs: []string{dir}}, inv, uuids); err == nil {
		t.Fatal("UUID names absent from an index-only spec must be an error")
	}
}

func TestAutoWritesOwnSpec(t *testing.T) {
	inv := inventory(t, "mock:dgxa100:mig")
	out := t.TempDir()
	ids := []string{inv.GPUs[3].UUID}
	r, err := Ensure(Config{Mode: ModeAuto, SpecDirs: []string{toolkitSpec(t, 8)}, WriteDir: out}, inv, ids)
	if err != nil {
		t.Fatal(err)
	}
	if r.Source != "own" || r.Kind != wellknown.CDIKind || len(r.Missing) != 1 {
		t.Fatalf("%+v", r)
	}
	names, err := Names([]string{out}, wellknown.CDIKind)
	if err != nil {
		t.Fatal(err)
	}
	// 6 full GPUs and 8 MIG devices, each by index and by UUID.
	if len(names) != 2*(6+8) {
		t.Fatalf("%d names: %v", len(names), names)
	}
	want := []string{wellknown.CDIKind + "=" + inv.GPUs[3].UUID, wellknown.CDIKind + "=3", wellknown.CDIKind + "=0:4", wellknown.CDIKind + "=" + inv.GPUs[1].MIG[2].UUID}
	for _, w := range want {
		found := false
		for _, n := range names {
			found = found || n == w
		}
		if !found {
			t.Errorf("own spec lacks %s", w)
		}
	}
	data, err := os.ReadFile(r.Path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), VoidEnv) {
		t.Errorf("own spec's common edits lack %s:\n%s", VoidEnv, data)
	}
}

func TestOwnModeAndErrors(t *testing.T) {
	inv := inventory(t, "mock:dgxh100")
	r, err := Ensure(Config{Mode: ModeOwn, WriteDir: t.TempDir(), DevRoot: "/run/nvidia/driver"}, inv, nil)
	if err != nil || r.Source != "own" {
		t.Fatalf("%+v %v", r, err)
	}
	data, _ := os.ReadFile(r.Path)
	if !strings.Contains(string(data), "hostPath: /run/nvidia/driver/dev/nvidia0") {
		t.Errorf("device root not applied:\n%s", data)
	}
	if _, err := Ensure(Config{Mode: "sometimes"}, inv, nil); err == nil {
		t.Error("bad mode: no error")
	}
	if _, err := Ensure(Config{Mode: ModeOwn}, inv, nil); err == nil {
		t.Error("no write dir: no error")
	}
}
