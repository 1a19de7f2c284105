package plugin

import (
	"slices"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuguard/gpuguard/agent/rm"
)

// startShared serves 2 shares of each GPU of a mock DGX A100.
func startShared(t *testing.T) (*Plugin, rm.Resource, pluginapi.DevicePluginClient) {
	t.Helper()
	rs, err := rm.TimeSlicing{Replicas: 2}.Apply(mockResources(t, "mock:dgxa100", rm.MIGMixed))
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
