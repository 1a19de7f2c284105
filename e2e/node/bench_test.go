//go:build e2e

package node

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	remote "k8s.io/cri-client/pkg"

	"github.com/gpuguard/gpuguard/e2e/framework"
)

// BenchmarkContainerCreate times CreateContainer at the node's real
// containerd, through its CRI socket, with and without the node enforcer
// registered on its NRI socket: the whole cost the enforcer adds to a
// container's creation (NRI's round trip, the kubelet's PodResources Get, the
// decision and the adjustment applied), as the kubelet sees it. The
// container is the probe image's (ENV NVIDIA_VISIBLE_DEVICES=all, no GPU),
// so the enforcer adjusts every one: its most expensive path short of CDI.
// The arms alternate, round after round, 100 creates each, over ten rounds:
// 1,000 creates an arm. Reported: each arm's p50 and p99, and the
// differences (enforcer minus none) at p50 and p99.
func BenchmarkContainerCreate(b *testing.B) {
	const rounds, perBatch = 10, 100
	ctx := context.Background()
	if err := s.node.Apply(ctx, enforced); err != nil {
		b.Fatal(err)
	}
	rs, err := remote.NewRemoteRuntimeServiceBuilder().WithEndpoint("unix://" + s.node.ContainerdSocket()).
		WithConnectionTimeout(10 * time.Second).WithTracerProvider(nil).Build(ctx)
	if err != nil {
		b.Fatal(err)
	}
	sandbox := &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: "bench-create", Namespace: tenantNS, Uid: "bench-create-uid"},
		Linux: &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
			NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE}}},
	}
	id, err := rs.RunPodSandbox(ctx, sandbox, "")
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		_ = rs.StopPodSandbox(ctx, id)
		_ = rs.RemovePodSandbox(ctx, id)
	}()
	enforcer := &enforcerSwitch{on: true} // Apply started it
	latencies := map[string][]time.Duration{}
	arms := []string{"none", "enforcer"}
	b.ResetTimer()
	for round := range rounds {
		for _, arm := range arms {
			if err := enforcer.set(ctx, arm == "enforcer"); err != nil {
				b.Fatal(err)
			}
			for i := range perBatch {
				cfg := &runtimeapi.ContainerConfig{
					Metadata: &runtimeapi.ContainerMetadata{Name: fmt.Sprintf("c-%s-%d-%d", arm, round, i)},
					Image:    &runtimeapi.ImageSpec{Image: framework.ProbeImage},
				}
				start := time.Now()
				cid, err := rs.CreateContainer(ctx, id, cfg, sandbox)
				latencies[arm] = append(latencies[arm], time.Since(start))
				if err != nil {
					b.Fatalf("%s: %v", arm, err)
				}
				if err := rs.RemoveContainer(ctx, cid); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	b.StopTimer()
	if err := enforcer.set(ctx, true); err != nil {
		b.Fatal(err)
	}
	p := map[string][2]time.Duration{}
	for _, arm := range arms {
		p50, p99 := nodePercentiles(latencies[arm])
		p[arm] = [2]time.Duration{p50, p99}
		b.ReportMetric(float64(p50.Microseconds()), "p50-"+arm+"-µs")
		b.ReportMetric(float64(p99.Microseconds()), "p99-"+arm+"-µs")
	}
	b.ReportMetric(float64((p["enforcer"][0] - p["none"][0]).Microseconds()), "p50-added-µs")
	b.ReportMetric(float64((p["enforcer"][1] - p["none"][1]).Microseconds()), "p99-added-µs")
}

// enforcerSwitch starts or stops the node's agent, and with it the
// enforcer, unless it is already so; it returns once the change holds.
type enforcerSwitch struct{ on bool }

func (e *enforcerSwitch) set(ctx context.Context, on bool) error {
	if on == e.on {
		return nil
	}
	e.on = on
	if on {
		return s.node.StartAgent(ctx)
	}
	return s.node.StopAgent()
}

func nodePercentiles(d []time.Duration) (p50, p99 time.Duration) {
	sorted := slices.Clone(d)
	slices.Sort(sorted)
	return sorted[len(sorted)/2], sorted[len(sorted)*99/100]
}
