package plugin

import (
	"sort"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuguard/gpuguard/agent/rm"
)

// reportLatencies adds p50 and p99 of the measured round trips.
func reportLatencies(b *testing.B, d []time.Duration) {
	if len(d) == 0 {
		return
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	pct := func(p float64) float64 { return float64(d[int(p*float64(len(d)-1))].Nanoseconds()) / 1e3 }
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
}

func BenchmarkAllocateRoundTrip(b *testing.B) {
	for _, list := range []string{"envvar", "volume-mounts", "cdi-annotations,cdi-cri"} {
		b.Run(list, func(b *testing.B) {
			_, _, c := startPlugin(b, list)
			ctx := ctxT(b)
			ids := []string{}
			for _, d := range mockResources(b, "mock:dgxa100", rm.MIGMixed)[0].Devices[:2] {
				ids = append(ids, d.ID)
			}
			req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				if _, err := c.Allocate(ctx, req); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
			}
			b.StopTimer()
			reportLatencies(b, lat)
		})
	}
}

func BenchmarkGetPreferredAllocationRoundTrip(b *testing.B) {
	_, _, c := startPlugin(b, "envvar")
	ctx := ctxT(b)
	var ids []string
	for _, d := range mockResources(b, "mock:dgxa100", rm.MIGMixed)[0].Devices {
		ids = append(ids, d.ID)
	}
	req := &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
		AvailableDeviceIDs: ids, MustIncludeDeviceIDs: ids[5:6], AllocationSize: 4,
	}}}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if _, err := c.GetPreferredAllocation(ctx, req); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	reportLatencies(b, lat)
}
