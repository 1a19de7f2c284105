package verifier

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/gpuguard/gpuguard/config"
)

// capsMajorForTest is the nvidia-caps major the fake /proc/devices names.
const capsMajorForTest = 508

// fakeDriverProc writes what the driver publishes for GPU 3's two MIG
// devices: their GPU and compute instance capabilities' minors.
func fakeDriverProc(t *testing.T, procRoot string) {
	t.Helper()
	write := func(rel, data string) {
		p := filepath.Join(procRoot, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("devices", "Character devices:\n  1 mem\n195 nvidia-frontend\n"+strconv.Itoa(capsMajorForTest)+" nvidia-caps\n\nBlock devices:\n  7 loop\n")
	write("driver/nvidia/capabilities/gpu3/mig/gi1/access", "DeviceFileMinor: 30\nDeviceFileMode: 292\n")
	write("driver/nvidia/capabilities/gpu3/mig/gi1/ci0/access", "DeviceFileMinor: 31\n")
	write("driver/nvidia/capabilities/gpu3/mig/gi2/access", "DeviceFileMinor: 39\n")
	write("driver/nvidia/capabilities/gpu3/mig/gi2/ci0/access", "DeviceFileMinor: 40\n")
}

// TestMIGCapabilitiesNameTheMIGDevice: a container allocated one MIG device
// reaches its parent's node and its own capabilities, and nothing is found; a
// container that also reaches another MIG device's compute instance
// capability on the same GPU is found with that MIG device. A GPU instance's
// capability, shared by its compute instances, counts as the parent GPU.
func TestMIGCapabilitiesNameTheMIGDevice(t *testing.T) {
	n := newNode(t)
	fakeDriverProc(t, n.procRoot)
	inv := testInventory()
	table := NewDeviceTable(inv)
	if err := table.AddMIGCaps(n.procRoot, inv); err != nil {
		t.Fatal(err)
	}
	own := Container{ID: "own", Key: key("team-a", "mig-a", "main"), PID: n.container(map[string]int{"nvidia3": 3})}
	wide := Container{ID: "wide", Key: key("team-a", "mig-wide", "main"), PID: n.container(map[string]int{"nvidia3": 3})}
	for _, c := range []struct {
		pid    int
		minors []uint32
	}{{own.PID, []uint32{30, 31}}, {wide.PID, []uint32{30, 31, 39, 40}}} {
		for _, m := range c.minors {
			n.mknod(filepath.Join(n.procRoot, strconv.Itoa(c.pid), "root", "dev", "nvidia-caps", "nvidia-cap"+strconv.Itoa(int(m))), capsMajorForTest, m)
		}
	}
	alloc := map[string][]string{"nvidia.com/mig-1g.10gb": {"MIG-3a"}}
	pol := config.Default()
	v := &Verifier{Containers: fakeContainers{own, wide}, Allocations: fakeAllocations{own.Key: alloc, wide.Key: alloc},
		Table: table, Resolver: NewGPUResolver(inv), IsGPUResource: pol.Spec.IsGPUResource, ProcRoot: n.procRoot}
	p, err := v.Check(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range p.Findings {
		got = append(got, f.Container.ID+":"+f.GPU.UUID+":"+f.GPU.Path)
	}
	if want := []string{"wide:MIG-3b:/dev/nvidia-caps/nvidia-cap40"}; !slices.Equal(got, want) {
		t.Errorf("findings %v, want %v", got, want)
	}
}

func TestNoMIGCapsWithoutTheDriver(t *testing.T) {
	table := NewDeviceTable(testInventory())
	before := len(table.byDev)
	if err := table.AddMIGCaps(t.TempDir(), testInventory()); err != nil || len(table.byDev) != before {
		t.Errorf("without /proc/devices: %v, %d entries (want %d)", err, len(table.byDev), before)
	}
}
