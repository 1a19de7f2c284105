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
// container is the probe image's (ENV NVIDIA_VISIBLE_DEVICES=all, no GPU)
// in a running pod's sandbox, so the enforcer reads the pod's allocation and
// adjusts every one: its most expensive path short of CDI.
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
	// The containers go into a pod's sandbox that the kubelet made: the
	// kubelet stops sandboxes it does not know, and the enforcer reads the
	// pod's allocation from it. Each is removed right after its creation.
	pod, err := s.node.StartHeldProbe(ctx, tenantNS, probePod("bench-create"))
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = s.node.DeletePod(ctx, tenantNS, pod.Name) }()
	sandboxes, err := rs.ListPodSandbox(ctx, &runtimeapi.PodSandboxFilter{
		LabelSelector: map[string]string{"io.kubernetes.pod.uid": string(pod.UID)},
		State:         &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY}})
	if err != nil || len(sandboxes) != 1 {
		b.Fatalf("the sandbox of %s: %v (%d found)", pod.Name, err, len(sandboxes))
	}
	id := sandboxes[0].Id
	sandbox := &runtimeapi.PodSandboxConfig{Metadata: sandboxes[0].Metadata, Labels: sandboxes[0].Labels}
	enforcer := &enforcerSwitch{on: true} // Apply started it
	defer func() { _ = enforcer.set(ctx, true) }()
	latencies := map[string][]time.Duration{}
	void := []*runtimeapi.KeyValue{{Key: "NVIDIA_VISIBLE_DEVICES", Value: []byte("void")}}
	arms := []struct {
		name     string
		enforcer bool
		env      []*runtimeapi.KeyValue
	}{
		{name: "none"},
		// adjusted: the image's all becomes void, with an Event on the pod.
		{name: "enforcer", enforcer: true},
		// unchanged: void already (as admission injects it), nothing to do.
		{name: "enforcer-unchanged", enforcer: true, env: void},
	}
	b.ResetTimer()
	for round := range rounds {
		for _, arm := range arms {
			if err := enforcer.set(ctx, arm.enforcer); err != nil {
				b.Fatal(err)
			}
			for i := range perBatch {
				cfg := &runtimeapi.ContainerConfig{
					Metadata: &runtimeapi.ContainerMetadata{Name: fmt.Sprintf("c-%s-%d-%d", arm.name, round, i)},
					Image:    &runtimeapi.ImageSpec{Image: framework.ProbeImage},
					Envs:     arm.env,
				}
				start := time.Now()
				cid, err := rs.CreateContainer(ctx, id, cfg, sandbox)
				latencies[arm.name] = append(latencies[arm.name], time.Since(start))
				if err != nil {
					b.Fatalf("%s: %v", arm.name, err)
				}
				if err := rs.RemoveContainer(ctx, cid); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	b.StopTimer()
	p := map[string][2]time.Duration{}
	for _, arm := range arms {
		p50, p99 := nodePercentiles(latencies[arm.name])
		p[arm.name] = [2]time.Duration{p50, p99}
		b.ReportMetric(float64(p50.Microseconds()), "p50-"+arm.name+"-µs")
		b.ReportMetric(float64(p99.Microseconds()), "p99-"+arm.name+"-µs")
	}
	for _, arm := range arms[1:] {
		b.ReportMetric(float64((p[arm.name][0] - p["none"][0]).Microseconds()), "p50-added-"+arm.name+"-µs")
		b.ReportMetric(float64((p[arm.name][1] - p["none"][1]).Microseconds()), "p99-added-"+arm.name+"-µs")
	}
	// The enforcer's own time per decision (the last enforcer batch's
	// agent), from its histogram: what of the added time is its own.
	m, err := s.node.AgentMetrics(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if n := m["gpuguard_agent_enforcer_decision_seconds_count"]; n > 0 {
		b.ReportMetric(m["gpuguard_agent_enforcer_decision_seconds_sum"]/n*1e6, "mean-decision-µs")
	}
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
