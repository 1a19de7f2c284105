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
// containerd, through its CRI socket, into a running pod's sandbox, with
// the node's agent running its enforcer on containerd's NRI socket and
// running without it: the same agent otherwise (device plugin and
// verifier), so that the difference is the enforcer's whole cost as the
// kubelet sees it (NRI's round trip, the kubelet's PodResources Get where
// the decision needs it, the decision and the adjustment applied).
//
// Two images an arm: the probe's (ENV NVIDIA_VISIBLE_DEVICES=all, no GPU),
// which the enforcer adjusts to void after reading the pod's allocation,
// recording an Event; and the pause image, which says nothing of GPUs and
// is decided without any read. After each switch the benchmark waits for
// the agent's first verifier pass, so that its start-up work does not land
// on a batch, and the switch's order alternates round by round. 100
// creates a batch, ten rounds: 1,000 creates an arm. Reported: each arm's
// p50 and p99, the added time (enforcer minus none, image for image) at
// both, and the enforcer's mean decision from its histogram.
func BenchmarkContainerCreate(b *testing.B) {
	const rounds, perBatch = 10, 100
	ctx := context.Background()
	without := enforced
	without.Enforce = false
	profiles := map[bool]framework.NodeProfile{true: enforced, false: without}
	if err := s.node.Apply(ctx, enforced); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = s.node.Apply(ctx, enforced) }()
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
	images := []struct{ name, ref string }{{"probe", framework.ProbeImage}, {"pause", framework.PauseImage}}
	latencies := map[string][]time.Duration{}
	on := true
	var decisions, decisionSeconds float64
	b.ResetTimer()
	for round := range rounds {
		order := []bool{false, true}
		if round%2 == 1 {
			order = []bool{true, false}
		}
		for _, enforce := range order {
			if enforce != on {
				b.StopTimer()
				if err := switchEnforcer(ctx, profiles[enforce]); err != nil {
					b.Fatal(err)
				}
				on = enforce
				b.StartTimer()
			}
			var n0, sum0 float64
			if enforce {
				if n0, sum0, err = decisionHistogram(ctx); err != nil {
					b.Fatal(err)
				}
			}
			for _, img := range images {
				arm := img.name + "-" + map[bool]string{true: "enforcer", false: "none"}[enforce]
				for i := range perBatch {
					cfg := &runtimeapi.ContainerConfig{
						Metadata: &runtimeapi.ContainerMetadata{Name: fmt.Sprintf("c-%s-%d-%d", arm, round, i)},
						Image:    &runtimeapi.ImageSpec{Image: img.ref},
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
			if enforce {
				n, sum, err := decisionHistogram(ctx)
				if err != nil {
					b.Fatal(err)
				}
				decisions, decisionSeconds = decisions+n-n0, decisionSeconds+sum-sum0
			}
		}
	}
	b.StopTimer()
	reportContainerCreate(b, latencies, images[0].name, images[1].name)
	if decisions < float64(rounds*perBatch*len(images)) {
		b.Fatalf("the enforcer judged %v containers of the %d created with it on", decisions, rounds*perBatch*len(images))
	}
	b.ReportMetric(decisionSeconds/decisions*1e6, "mean-decision-µs")
}

// switchEnforcer restarts the agent with the profile and waits for its
// verifier's first pass.
func switchEnforcer(ctx context.Context, p framework.NodeProfile) error {
	if err := s.node.Apply(ctx, p); err != nil {
		return err
	}
	return framework.Poll(ctx, time.Minute, func() (bool, error) {
		m, err := s.node.AgentMetrics(ctx)
		return err == nil && m[`gpuguard_agent_verify_passes_total{result="ok"}`] > 0, nil
	})
}

// decisionHistogram is the count and sum of the running agent's enforcer
// decision histogram.
func decisionHistogram(ctx context.Context) (n, sum float64, err error) {
	m, err := s.node.AgentMetrics(ctx)
	if err != nil {
		return 0, 0, err
	}
	return m["gpuguard_agent_enforcer_decision_seconds_count"], m["gpuguard_agent_enforcer_decision_seconds_sum"], nil
}

// reportContainerCreate reports each arm's p50 and p99 and, image for
// image, the enforcer's added time at both.
func reportContainerCreate(b *testing.B, latencies map[string][]time.Duration, images ...string) {
	for _, img := range images {
		none, with := latencies[img+"-none"], latencies[img+"-enforcer"]
		p50n, p99n := nodePercentiles(none)
		p50e, p99e := nodePercentiles(with)
		b.ReportMetric(float64(p50n.Microseconds()), "p50-"+img+"-none-µs")
		b.ReportMetric(float64(p99n.Microseconds()), "p99-"+img+"-none-µs")
		b.ReportMetric(float64(p50e.Microseconds()), "p50-"+img+"-enforcer-µs")
		b.ReportMetric(float64(p99e.Microseconds()), "p99-"+img+"-enforcer-µs")
		b.ReportMetric(float64((p50e - p50n).Microseconds()), "p50-added-"+img+"-µs")
		b.ReportMetric(float64((p99e - p99n).Microseconds()), "p99-added-"+img+"-µs")
	}
}

func nodePercentiles(d []time.Duration) (p50, p99 time.Duration) {
	sorted := slices.Clone(d)
	slices.Sort(sorted)
	return sorted[len(sorted)/2], sorted[len(sorted)*99/100]
}
