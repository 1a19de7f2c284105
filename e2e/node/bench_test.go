//go:build e2e

package node

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	remote "k8s.io/cri-client/pkg"

	"github.com/gpuguard/gpuguard/e2e/framework"
)

// BenchmarkContainerCreate times CreateContainer at the node's real
// containerd, through its CRI socket, into a running pod's sandbox, in
// three arms: the node's agent without its enforcer (none); the same beside
// a plugin that subscribes to container creation on containerd's NRI
// socket and changes nothing (noop: what any NRI plugin costs); and the
// agent running its enforcer there (enforcer). The agent is the same
// otherwise (device plugin and verifier), so that enforcer minus none is
// the enforcer's whole cost as the kubelet sees it (NRI's round trip, the
// kubelet's PodResources Get where the decision needs it, the decision and
// the adjustment applied), and enforcer minus noop what gpuguard adds to
// any plugin's.
//
// Two images an arm: the probe's (ENV NVIDIA_VISIBLE_DEVICES=all, no GPU),
// which the enforcer adjusts to void after reading the pod's allocation,
// recording an Event; and the pause image, which says nothing of GPUs and
// is decided without any read. After each switch of the agent the
// benchmark waits for its verifier's first pass, so that its start-up work
// does not land on a batch; the arms' order rotates round by round. 200
// creates a batch, ten rounds: 2,000 creates an arm and image. Reported:
// each arm's p50 and p99, the added time (image for image, against none
// and, for the enforcer, against noop) at both, and the enforcer's mean
// decision from its histogram.
//
// make bench-e2e keeps the node's state on tmpfs where it can: on disk,
// containerd's and etcd's flushes put the tails of container creation
// (p99 30–70 ms) far beyond the differences measured.
func BenchmarkContainerCreate(b *testing.B) {
	const rounds, perBatch = 10, 200
	ctx := context.Background()
	if err := s.node.Apply(ctx, enforced); err != nil {
		b.Fatal(err)
	}
	sw := &createArms{current: armEnforcer}
	defer func() { _ = sw.to(ctx, armEnforcer) }()
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
	// Each container gets a log path, as the kubelet gives it: removing a
	// container it does not know, the kubelet deletes every file matching
	// its log path plus "*", which for a container without one is every
	// file of the kubelet's working directory.
	sandbox := &runtimeapi.PodSandboxConfig{Metadata: sandboxes[0].Metadata, Labels: sandboxes[0].Labels,
		LogDirectory: filepath.Join(s.node.Root, "bench-logs")}
	images := []struct{ name, ref string }{{"probe", framework.ProbeImage}, {"pause", framework.PauseImage}}
	arms := []createArm{armNone, armNoop, armEnforcer}
	latencies := map[string][]time.Duration{}
	var decisions, decisionSeconds float64
	b.ResetTimer()
	for round := range rounds {
		for k := range arms {
			arm := arms[(k+round)%len(arms)]
			b.StopTimer()
			if err := sw.to(ctx, arm); err != nil {
				b.Fatal(err)
			}
			var n0, sum0 float64
			if arm == armEnforcer {
				if n0, sum0, err = decisionHistogram(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.StartTimer()
			for _, img := range images {
				name := img.name + "-" + string(arm)
				for i := range perBatch {
					cfg := &runtimeapi.ContainerConfig{
						Metadata: &runtimeapi.ContainerMetadata{Name: fmt.Sprintf("c-%s-%d-%d", name, round, i)},
						Image:    &runtimeapi.ImageSpec{Image: img.ref},
						LogPath:  fmt.Sprintf("c-%s-%d-%d.log", name, round, i),
					}
					start := time.Now()
					cid, err := rs.CreateContainer(ctx, id, cfg, sandbox)
					latencies[name] = append(latencies[name], time.Since(start))
					if err != nil {
						b.Fatalf("%s: %v", name, err)
					}
					if err := rs.RemoveContainer(ctx, cid); err != nil {
						b.Fatal(err)
					}
				}
			}
			if arm == armEnforcer {
				n, sum, err := decisionHistogram(ctx)
				if err != nil {
					b.Fatal(err)
				}
				decisions, decisionSeconds = decisions+n-n0, decisionSeconds+sum-sum0
			}
		}
	}
	b.StopTimer()
	for _, img := range images {
		reportAdded(b, latencies, img.name, armNoop, armNone)
		reportAdded(b, latencies, img.name, armEnforcer, armNone)
		reportAdded(b, latencies, img.name, armEnforcer, armNoop)
	}
	if want := float64(rounds * perBatch * len(images)); decisions < want {
		b.Fatalf("the enforcer judged %v containers of the %v created with it on", decisions, want)
	}
	b.ReportMetric(decisionSeconds/decisions*1e6, "mean-decision-µs")
}

// createArm is what judges a container's creation at the node.
type createArm string

const (
	armNone     createArm = "none"
	armNoop     createArm = "noop"
	armEnforcer createArm = "enforcer"
)

// createArms switches the node between the arms.
type createArms struct{ current createArm }

// to puts the node in arm a: the agent restarted with or without its
// enforcer where that changes (then its verifier's first pass awaited),
// and the no-op plugin started or stopped.
func (c *createArms) to(ctx context.Context, a createArm) error {
	if a == c.current {
		return nil
	}
	if c.current == armNoop {
		if err := s.node.StopNoopNRIPlugin(); err != nil {
			return err
		}
	}
	if (a == armEnforcer) != (c.current == armEnforcer) {
		p := enforced
		p.Enforce = a == armEnforcer
		if err := switchEnforcer(ctx, p); err != nil {
			return err
		}
	}
	if a == armNoop {
		if err := s.node.StartNoopNRIPlugin(ctx); err != nil {
			return err
		}
	}
	c.current = a
	return nil
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

// reportAdded reports, for one image, arm a's p50 and p99 and what it adds
// to reference arm ref's at both.
func reportAdded(b *testing.B, latencies map[string][]time.Duration, img string, a, ref createArm) {
	p50, p99 := nodePercentiles(latencies[img+"-"+string(a)])
	p50r, p99r := nodePercentiles(latencies[img+"-"+string(ref)])
	b.ReportMetric(float64(p50.Microseconds()), "p50-"+img+"-"+string(a)+"-µs")
	b.ReportMetric(float64(p99.Microseconds()), "p99-"+img+"-"+string(a)+"-µs")
	b.ReportMetric(float64(p50r.Microseconds()), "p50-"+img+"-"+string(ref)+"-µs")
	b.ReportMetric(float64(p99r.Microseconds()), "p99-"+img+"-"+string(ref)+"-µs")
	b.ReportMetric(float64((p50 - p50r).Microseconds()), "p50-"+img+"-"+string(a)+"-over-"+string(ref)+"-µs")
	b.ReportMetric(float64((p99 - p99r).Microseconds()), "p99-"+img+"-"+string(a)+"-over-"+string(ref)+"-µs")
}

func nodePercentiles(d []time.Duration) (p50, p99 time.Duration) {
	sorted := slices.Clone(d)
	slices.Sort(sorted)
	return sorted[len(sorted)/2], sorted[len(sorted)*99/100]
}
