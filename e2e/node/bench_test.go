//go:build e2e

package node

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuguard/gpuguard/e2e/framework"
	"github.com/gpuguard/gpuguard/e2e/framework/kubenode"
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
// which the enforcer adjusts to void from the pod's allocation, recording
// an Event; and the pause image, which says nothing of GPUs and is decided
// without it. The pod's allocation is read as a pod's own containers find
// it: a read serves the pod's creations for 10 s, so that a batch makes
// about one read, and the rest use it (the reads at creation are
// reported). After each switch of the agent the
// benchmark waits for its verifier's first pass, so that its start-up work
// does not land on a batch; the arms' order rotates round by round. 200
// creates a batch, ten rounds: 2,000 creates an arm and image. Reported:
// each arm's p50 and p99, the added time (image for image, against none
// and, for the enforcer, against noop) at both, and the enforcer's own
// decisions from its histogram, image by image: their mean, bounds of
// their p50 and p99 (the bucket each falls in, in steps of √2), and the
// reads of the kubelet their creations made.
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
	// Each container is removed right after its creation.
	sb, stop, err := startHeldSandbox(ctx, "bench-create", "bench-logs")
	if err != nil {
		b.Fatal(err)
	}
	defer stop()
	images := []struct{ name, ref string }{{"probe", kubenode.ProbeImage}, {"pause", kubenode.PauseImage}}
	arms := []createArm{armNone, armNoop, armEnforcer}
	latencies := map[string][]time.Duration{}
	judged := map[string]decisions{}
	b.ResetTimer()
	for round := range rounds {
		for k := range arms {
			arm := arms[(k+round)%len(arms)]
			b.StopTimer()
			if err := sw.to(ctx, arm); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			for _, img := range images {
				name := img.name + "-" + string(arm)
				var before decisions
				if arm == armEnforcer {
					b.StopTimer()
					if before, err = decisionHistogram(ctx); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
				for i := range perBatch {
					start := time.Now()
					cid, err := sb.create(ctx, fmt.Sprintf("c-%s-%d-%d", name, round, i), img.ref)
					latencies[name] = append(latencies[name], time.Since(start))
					if err != nil {
						b.Fatalf("%s: %v", name, err)
					}
					if err := sb.runtime.RemoveContainer(ctx, cid); err != nil {
						b.Fatal(err)
					}
				}
				if arm == armEnforcer {
					b.StopTimer()
					after, err := decisionHistogram(ctx)
					if err != nil {
						b.Fatal(err)
					}
					judged[img.name] = judged[img.name].add(after.minus(before))
					b.StartTimer()
				}
			}
		}
	}
	b.StopTimer()
	for _, img := range images {
		reportAdded(b, latencies, img.name, armNoop, armNone)
		reportAdded(b, latencies, img.name, armEnforcer, armNone)
		reportAdded(b, latencies, img.name, armEnforcer, armNoop)
		d := judged[img.name]
		if want := float64(rounds * perBatch); d.count < want {
			b.Fatalf("the enforcer judged %v %s containers of the %v created with it on", d.count, img.name, want)
		}
		b.ReportMetric(d.sum/d.count*1e6, "mean-decision-"+img.name+"-µs")
		b.ReportMetric(d.quantile(0.5)*1e6, "p50-decision-"+img.name+"-at-most-µs")
		b.ReportMetric(d.quantile(0.99)*1e6, "p99-decision-"+img.name+"-at-most-µs")
		b.ReportMetric(d.reads, "kubelet-reads-at-creation-"+img.name)
	}
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
func switchEnforcer(ctx context.Context, p kubenode.NodeProfile) error {
	if err := s.node.Apply(ctx, p); err != nil {
		return err
	}
	return framework.Poll(ctx, time.Minute, func() (bool, error) {
		m, err := s.node.AgentMetrics(ctx)
		return err == nil && m[`gpuguard_agent_verify_passes_total{result="ok"}`] > 0, nil
	})
}

// decisions is a stretch of the enforcer's decision histogram: how many,
// their total seconds, and how many took at most each bucket's bound; and
// how many reads of the kubelet creations made in that stretch.
type decisions struct {
	count, sum float64
	atMost     map[float64]float64
	reads      float64
}

// decisionHistogram reads the running agent's enforcer decision histogram.
func decisionHistogram(ctx context.Context) (decisions, error) {
	m, err := s.node.AgentMetrics(ctx)
	if err != nil {
		return decisions{}, err
	}
	const name = "gpuguard_agent_enforcer_decision_seconds"
	d := decisions{count: m[name+"_count"], sum: m[name+"_sum"], atMost: map[float64]float64{},
		reads: m[`gpuguard_agent_enforcer_kubelet_reads_total{at="creation"}`]}
	for k, v := range m {
		bound, ok := strings.CutPrefix(k, name+`_bucket{le="`)
		if !ok {
			continue
		}
		le, err := strconv.ParseFloat(strings.TrimSuffix(bound, `"}`), 64)
		if err != nil {
			return decisions{}, fmt.Errorf("bucket %s: %w", k, err)
		}
		d.atMost[le] = v
	}
	return d, nil
}

func (d decisions) minus(o decisions) decisions {
	out := decisions{count: d.count - o.count, sum: d.sum - o.sum, atMost: map[float64]float64{}, reads: d.reads - o.reads}
	for le, v := range d.atMost {
		out.atMost[le] = v - o.atMost[le]
	}
	return out
}

func (d decisions) add(o decisions) decisions {
	out := decisions{count: d.count + o.count, sum: d.sum + o.sum, atMost: map[float64]float64{}, reads: d.reads + o.reads}
	for le, v := range o.atMost {
		out.atMost[le] = v + d.atMost[le]
	}
	return out
}

// quantile is the least bucket bound that at least q of the decisions
// took at most: an upper bound of the quantile.
func (d decisions) quantile(q float64) float64 {
	bounds := slices.Sorted(maps.Keys(d.atMost))
	for _, le := range bounds {
		if d.atMost[le] >= q*d.count {
			return le
		}
	}
	return math.Inf(1)
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
