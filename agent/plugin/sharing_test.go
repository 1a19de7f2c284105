package plugin

import (
	"slices"
	"strings"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

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

// startShared serves 2 shares of each GPU of a mock DGX A100.
func startShared(t *testing.T) (*Plugin, Resource, pluginapi.DevicePluginClient) {
	t.Helper()
	rs, err := TimeSlicing{Replicas: 2}.Apply(mockResources(t, "mock:dgxa100", MIGMixed))
	if err != nil {
		t.Fatal(err)
	}
	p, _, c := serveResource(t, rs[0], "envvar")
	return p, rs[0], c
}

func TestAllocateSharesGivesEachGPUOnce(t *testing.T) {
	_, r, c := startShared(t)
	gpu0, gpu1 := r.Devices[0].Ref.UUID, r.Devices[2].Ref.UUID
	resp, err := c.Allocate(ctxT(t), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{gpu0 + "::0", gpu0 + "::1", gpu1 + "::1"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.ContainerResponses[0].Envs["NVIDIA_VISIBLE_DEVICES"]; got != gpu0+","+gpu1 {
		t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want each GPU once: %s,%s", got, gpu0, gpu1)
	}
	for _, bad := range [][]string{{gpu0}, {gpu0 + "::2"}, {gpu0 + "::0", gpu0 + "::0"}} {
		if _, err := c.Allocate(ctxT(t), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: bad}}}); err == nil {
			t.Errorf("allocating %v succeeded", bad)
		}
	}
}

func TestUnhealthyGPUFailsAllItsShares(t *testing.T) {
	p, r, c := startShared(t)
	bad := r.Devices[6].Ref.UUID
	if !p.Has(bad) || p.Has(r.Devices[6].ID) {
		t.Fatalf("Has answers by share ID, not GPU UUID")
	}
	p.SetHealth(bad, false, "XID 79")
	var unhealthy []string
	for _, d := range listDevices(t, c) {
		if d.Health == pluginapi.Unhealthy {
			unhealthy = append(unhealthy, d.ID)
		}
	}
	if want := []string{bad + "::0", bad + "::1"}; !slices.Equal(unhealthy, want) {
		t.Errorf("unhealthy %v, want %v", unhealthy, want)
	}
}

func TestPreferredSharesSpreadOverGPUs(t *testing.T) {
	p, r, _ := startShared(t)
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
		got, err := preferredAllocation(p.state, tc.avail, tc.must, tc.size)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%s: got %v %v, want %v", tc.name, got, err, tc.want)
		}
	}
}
