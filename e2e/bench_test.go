//go:build e2e

package e2e

import (
	"context"
	"flag"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BenchmarkPodCreate measures what admission adds to a pod create through the
// real API server, timed at the client (the API server's own webhook latency
// histogram starts at 5 ms, too coarse for this). The arms alternate batch by
// batch in the same run, so that a noisy machine weighs on all alike:
//
//   - without: no admission policy at all, the reference;
//   - min-vap, min-map, min-map+min-vap: a minimal ValidatingAdmissionPolicy
//     (one short expression) and MutatingAdmissionPolicy (one short JSON
//     Patch), the in-process floors; min-map+min-vap+idle-webhooks: both,
//     beside gpuguard's webhook configurations behind a condition that no
//     benchmark pod meets (the floor of the default install's shape: what
//     two webhook configurations cost a pod they never call);
//   - noop-webhook: both webhook configurations at a webhook that decodes and
//     allows (the price of any webhook); patch-webhook: the mutating one at a
//     webhook that returns gpuguard's void patch without evaluating (the
//     floor of a webhook that injects);
//   - cel-vap, cel-map, cel: gpuguard's rendered policies, alone and together;
//   - webhook: gpuguard's webhooks; inject-webhook+cel-vap: gpuguard's
//     mutating webhook beside its VAP;
//   - default: what helm install gives: the CEL backstop, and the webhooks
//     behind the pre-filter, which ordinary pods do not pass once the
//     backstop has injected their void; default-unfiltered: the same
//     without the pre-filter on the webhooks;
//   - hardened: the VAP of a policy without injection, for clusters whose
//     nodes refuse environment device requests;
//   - node-enforced: what admission is while every GPU node is covered
//     (each runs the node enforcer, or carries the hardened mark), with
//     injectVoid auto: that VAP, and the webhooks behind the pre-filter of
//     the policy without injection; hardened+idle-webhooks: that VAP beside
//     idle webhook configurations, the floor of the node-enforced shape.
//
// Each arm's p50 and p99 are reported, and its p50 as a ratio to without's
// (p50-ratio-ARM). BenchmarkPodCreateConcurrent measures throughput.
func BenchmarkPodCreate(b *testing.B) {
	// 1,000 pods an arm: with 250 (five rounds of 50), a run's p50s moved by
	// as much as 0.3 of a pod create from run to run, the width of the
	// differences measured; each arm's batches last a fraction of a second,
	// and the API server's and etcd's periodic work landed on a few of them.
	const rounds, perBatch = 10, 100
	ctx := context.Background()
	bench := newBenchBackends(b)
	arms := benchArms()
	latencies := map[string][]time.Duration{}
	defer bench.restore(b)
	for round := range rounds {
		for _, a := range inRoundOrder(arms, round, rounds) {
			if err := bench.arrange(ctx, a); err != nil {
				b.Fatalf("%s: %v", a.name, err)
			}
			for i := range perBatch {
				start := time.Now()
				if err := createBenchPod(ctx, a, round, i); err != nil {
					b.Fatalf("%s: %v", a.name, err)
				}
				latencies[a.name] = append(latencies[a.name], time.Since(start))
			}
			if err := s.cp.Client.CoreV1().Pods(enforceNS).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
				b.Fatal(err)
			}
		}
	}
	base, _ := percentiles(latencies["without"])
	for _, a := range arms {
		p50, p99 := percentiles(latencies[a.name])
		b.ReportMetric(float64(p50.Microseconds()), "p50-"+a.name+"-µs")
		b.ReportMetric(float64(p99.Microseconds()), "p99-"+a.name+"-µs")
		if a.name != "without" {
			b.ReportMetric(float64(p50)/float64(base), "p50-ratio-"+a.name)
		}
	}
}

// concurrentArms are BenchmarkPodCreateConcurrent's arms; a shorter list
// gives a quicker run of the arms that matter to a question.
var concurrentArms = flag.String("bench.concurrent-arms", "without,min-map,min-map+min-vap,min-map+min-vap+idle-webhooks,patch-webhook,"+
	"cel,inject-webhook+cel-vap,default,hardened,hardened+idle-webhooks,node-enforced",
	"comma-separated arms of BenchmarkPodCreateConcurrent, without first")

// BenchmarkPodCreateConcurrent creates pods from 16 clients at once, arm
// after arm in alternation, and reports each arm's throughput as a ratio to
// no policy's (throughput-ratio-ARM). Beside gpuguard's arms it measures the
// floors: the minimal MAP, alone and with the minimal VAP (the in-process
// floor), the two beside idle webhook configurations (the floor of the
// default install's shape), and the reference patch webhook (the floor of an
// injecting webhook). No install that injects can do better than the lower
// of the minimal MAP and the patch webhook on the same machine.
func BenchmarkPodCreateConcurrent(b *testing.B) {
	// 2,560 pods a batch, about 3 s: with 640, under a second, one pause
	// of the API server moved an arm's round by a third, and the lineup
	// of eleven arms could not resolve a goal of 0.8.
	const rounds, clients, perClient = 5, 16, 160
	ctx := context.Background()
	bench := newBenchBackends(b)
	defer bench.restore(b)
	// byRound[arm][round] is how long the arm's batch of that round took.
	byRound := map[string][]time.Duration{}
	arms := armsNamed(b, strings.Split(*concurrentArms, ",")...)
	if arms[0].name != "without" {
		b.Fatalf("-bench.concurrent-arms must start with without, the reference, not %s", arms[0].name)
	}
	for round := range rounds {
		for _, a := range inRoundOrder(arms, round, rounds) {
			if err := bench.arrange(ctx, a); err != nil {
				b.Fatalf("%s: %v", a.name, err)
			}
			d, err := createConcurrently(ctx, a.name, round, clients, perClient)
			if err != nil {
				b.Fatalf("%s: %v", a.name, err)
			}
			byRound[a.name] = append(byRound[a.name], d)
			if err := s.cp.Client.CoreV1().Pods(enforceNS).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
				b.Fatal(err)
			}
		}
	}
	elapsed := func(arm string) float64 {
		var total time.Duration
		for _, d := range byRound[arm] {
			total += d
		}
		return total.Seconds()
	}
	pods := float64(rounds * clients * perClient)
	for _, a := range arms {
		b.ReportMetric(pods/elapsed(a.name), "pods/s-"+a.name)
	}
	for _, a := range arms[1:] {
		b.ReportMetric(elapsed("without")/elapsed(a.name), "throughput-ratio-"+a.name)
		// The spread: the lowest and highest of the arm's rounds, each
		// against without's batch of the same round.
		lo, hi := math.Inf(1), math.Inf(-1)
		for r, d := range byRound[a.name] {
			ratio := byRound["without"][r].Seconds() / d.Seconds()
			lo, hi = min(lo, ratio), max(hi, ratio)
		}
		b.ReportMetric(lo, "throughput-ratio-lowest-round-"+a.name)
		b.ReportMetric(hi, "throughput-ratio-highest-round-"+a.name)
	}
}

// createBenchPod creates the benchmark's pod: an init container, a plain
// container and a GPU container, so that every arm has work of each kind.
func createBenchPod(ctx context.Context, a benchArm, round, i int) error {
	p := plainPod(fmt.Sprintf("bench-%s-%d-%d", strings.NewReplacer("+", "-", ".", "-").Replace(a.name), round, i))
	p.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "busybox"}}
	if a.voided {
		void := corev1.EnvVar{Name: "NVIDIA_VISIBLE_DEVICES", Value: "void"}
		p.Spec.InitContainers[0].Env = []corev1.EnvVar{void}
		p.Spec.Containers[0].Env = []corev1.EnvVar{void}
	}
	p.Spec.Containers = append(p.Spec.Containers, gpuContainer("train"))
	_, err := s.cp.Client.CoreV1().Pods(enforceNS).Create(ctx, p, metav1.CreateOptions{})
	return err
}

// createConcurrently creates clients × perClient pods from clients
// goroutines and returns how long it took.
func createConcurrently(ctx context.Context, arm string, round, clients, perClient int) (time.Duration, error) {
	var wg sync.WaitGroup
	var failed atomic.Value
	start := time.Now()
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perClient {
				if err := createBenchPod(ctx, benchArm{name: arm + "-c"}, round, c*perClient+i); err != nil {
					failed.Store(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err, ok := failed.Load().(error); ok {
		return 0, err
	}
	return time.Since(start), nil
}

// inRoundOrder is the arms in the order round runs them: rotated by an
// equal share each round, so that every arm runs early and late in the
// rounds, and reversed every other round, so that each arm follows one of
// its neighbours in the list in one round and the other in the next. Run
// in one fixed order, an arm's throughput depended on what ran before it
// (the API server's garbage and etcd's growth from the heavier arms land
// on the next batch): the same node-enforced arm kept 0.61 of no policy's
// throughput last in a list of ten, and 0.92 second in a list of five. A
// rotation alone kept every arm's predecessor but at the rounds' seams.
func inRoundOrder(arms []benchArm, round, rounds int) []benchArm {
	k := round * len(arms) / rounds % len(arms)
	order := append(slices.Clone(arms[k:]), arms[:k]...)
	if round%2 == 1 {
		slices.Reverse(order)
	}
	return order
}

func percentiles(d []time.Duration) (p50, p99 time.Duration) {
	slices.Sort(d)
	return d[len(d)/2], d[len(d)*99/100]
}
