package rm

import (
	"slices"
	"strings"
	"testing"

	"github.com/gpuguard/gpuguard/agent/discovery"
	"github.com/gpuguard/gpuguard/agent/discovery/discoverytest"
)

func mockResources(t testing.TB, spec, mig string) []Resource {
	t.Helper()
	rs, err := BuildResources(discoverytest.Inventory(t, spec), mig)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func TestPreferredAllocation(t *testing.T) {
	rs := mockResources(t, "mock:dgxa100", MIGMixed)
	st := New(rs[0])
	id := func(i ...int) []string {
		var out []string
		for _, x := range i {
			out = append(out, rs[0].Devices[x].ID)
		}
		return out
	}
	all := id(0, 1, 2, 3, 4, 5, 6, 7)
	cases := []struct {
		name        string
		avail, must []string
		size        int
		want        []string
	}{
		{"packed on NUMA 0", all, nil, 2, id(0, 1)},
		{"fits only NUMA 1", id(0, 1, 4, 5, 6), nil, 3, id(4, 5, 6)},
		{"smallest fitting node", id(0, 1, 2, 5, 6), nil, 2, id(5, 6)},
		{"must-include pulls its node", all, id(5), 2, id(5, 4)},
		{"spans nodes when needed", all, nil, 6, id(0, 1, 2, 3, 4, 5)},
		{"everything", all, nil, 8, all},
		{"largest node first when none fits", id(0, 4, 5, 6), nil, 4, id(4, 5, 6, 0)},
	}
	for _, tc := range cases {
		got, err := st.Preferred(tc.avail, tc.must, tc.size)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestPreferredAllocationUnknownNUMA(t *testing.T) {
	devs := []Device{
		{ID: "a", NUMANode: discovery.UnknownNUMANode, PCIBusID: "0000:02:00.0"},
		{ID: "b", NUMANode: discovery.UnknownNUMANode, PCIBusID: "0000:01:00.0"},
		{ID: "c", NUMANode: discovery.UnknownNUMANode, PCIBusID: "0000:03:00.0"},
	}
	got, err := New(Resource{Name: "r", Devices: devs}).Preferred([]string{"a", "b", "c"}, nil, 2)
	if err != nil || !slices.Equal(got, []string{"b", "a"}) {
		t.Fatalf("got %v %v, want PCI-ordered [b a]", got, err)
	}
}

func TestResourcesByMIGStrategy(t *testing.T) {
	got := map[string]int{}
	for _, r := range mockResources(t, "mock:dgxa100:mig", MIGMixed) {
		got[r.Name] = len(r.Devices)
	}
	want := map[string]int{"nvidia.com/gpu": 6, "nvidia.com/mig-1g.5gb": 4, "nvidia.com/mig-2g.10gb": 2, "nvidia.com/mig-3g.20gb": 2}
	if len(got) != len(want) {
		t.Fatalf("resources %v", got)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %d devices, want %d", k, got[k], v)
		}
	}
	none := mockResources(t, "mock:dgxa100:mig", MIGNone)
	if len(none) != 1 || len(none[0].Devices) != 8 {
		t.Fatalf("none strategy: %v", none)
	}
	if _, err := BuildResources(&discovery.Inventory{}, "single"); err == nil {
		t.Error("unsupported MIG strategy: no error")
	}
}

func TestTimeSlicingAdvertisesShares(t *testing.T) {
	whole := mockResources(t, "mock:dgxa100", MIGMixed)
	for _, tc := range []struct {
		ts   TimeSlicing
		name string
	}{
		{TimeSlicing{Replicas: 4}, GPUResource},
		{TimeSlicing{Replicas: 4, Rename: true}, GPUResource + SharedSuffix},
	} {
		shared, err := tc.ts.Apply(whole)
		if err != nil {
			t.Fatal(err)
		}
		if len(shared) != 1 || shared[0].Name != tc.name || len(shared[0].Devices) != 32 {
			t.Fatalf("%+v: %d resources, %q with %d devices; want %s with 32", tc.ts, len(shared), shared[0].Name, len(shared[0].Devices), tc.name)
		}
		d := shared[0].Devices[5]
		if d.ID != whole[0].Devices[1].ID+"::1" || d.Ref != whole[0].Devices[1].Ref || !d.Replica {
			t.Errorf("share 5 is %+v, want the second share of GPU 1", d)
		}
	}
	if same, err := (TimeSlicing{Replicas: 1}).Apply(whole); err != nil || same[0].Devices[0].ID != whole[0].Devices[0].ID {
		t.Errorf("one replica changed the devices: %v", err)
	}
	if _, err := (TimeSlicing{Replicas: 0}).Apply(whole); err == nil || !strings.Contains(err.Error(), "--time-slicing-replicas=0") {
		t.Errorf("zero replicas: %v", err)
	}
}

func TestPreferredSharesSpreadOverGPUs(t *testing.T) {
	rs, err := TimeSlicing{Replicas: 2}.Apply(mockResources(t, "mock:dgxa100", MIGMixed))
	if err != nil {
		t.Fatal(err)
	}
	r := rs[0]
	m := New(r)
	share := func(gpu, n int) string { return r.Devices[2*gpu+n].ID }
	var all []string
	for _, d := range r.Devices {
		all = append(all, d.ID)
	}
	cases := []struct {
		name        string
		avail, must []string
		size        int
		want        []string
	}{
		{"two shares, two GPUs", all, nil, 2, []string{share(0, 0), share(1, 0)}},
		{"least busy GPU first", slices.Delete(slices.Clone(all), 0, 1), nil, 1, []string{share(1, 0)}},
		{"must-include's GPU last", all, []string{share(0, 1)}, 2, []string{share(0, 1), share(1, 0)}},
		{"only one GPU left", []string{share(3, 0), share(3, 1)}, nil, 2, []string{share(3, 0), share(3, 1)}},
	}
	for _, tc := range cases {
		got, err := m.Preferred(tc.avail, tc.must, tc.size)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%s: got %v %v, want %v", tc.name, got, err, tc.want)
		}
	}
}
