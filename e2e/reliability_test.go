//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpuguard/gpuguard/e2e/framework"
	"github.com/gpuguard/gpuguard/e2e/framework/controlplane"
)

// The reliability suite drives the webhook through the real API server as a
// busy or hostile cluster would: load from concurrent clients, policy churn,
// crashes under both failure policies, certificate rotation, and malformed
// and oversized reviews. Every run checks that nothing was admitted
// unguarded, from the clients' view and from a final List; that no pod is
// stored after its client got an error; and, where the webhook ran
// throughout, that it logged one line per decision. Hostile reviews also
// check memory and that nothing panicked. Figures are logged with the prefix
// "reliability:" and kept in docs/reliability.md.

const reliabilityNS = "team-reliability"

// loadClient creates pods without client-side throttling, as many
// controllers at once would.
func loadClient(t *testing.T) kubernetes.Interface {
	t.Helper()
	cfg := rest.CopyConfig(s.cp.Config)
	cfg.QPS, cfg.Burst = -1, 0
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// load is what concurrent clients saw: pods admitted (and stored with void),
// leaking pods denied, client errors by pod name, and anything unguarded.
type load struct {
	client kubernetes.Interface
	prefix string

	mu        sync.Mutex
	admitted  int
	denied    int
	failed    map[string]error
	unguarded []string
}

func newLoad(t *testing.T, prefix string) *load {
	return &load{client: loadClient(t), prefix: prefix, failed: map[string]error{}}
}

// run has clients create pods until stop is closed, or perClient each when
// perClient > 0. Every third pod asks for every GPU.
func (l *load) run(ctx context.Context, clients, perClient int, stop <-chan struct{}) {
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for i := 0; perClient == 0 || i < perClient; i++ {
				select {
				case <-stop:
					return
				default:
				}
				l.create(ctx, fmt.Sprintf("%s-%d-%d", l.prefix, c, i), i%3 == 2)
			}
		})
	}
	wg.Wait()
}

// background runs clients until the returned function is first called.
func (l *load) background(ctx context.Context, clients int) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() { l.run(ctx, clients, 0, done); close(finished) }()
	var once sync.Once
	return func() { once.Do(func() { close(done); <-finished }) }
}

func (l *load) create(ctx context.Context, name string, leak bool) {
	pod := plainPod(name)
	if leak {
		pod = withEnv(plainPod(name+"-leak"), allGPUs)
	}
	stored, err := l.client.CoreV1().Pods(reliabilityNS).Create(ctx, pod, metav1.CreateOptions{})
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case err == nil && leak:
		l.unguarded = append(l.unguarded, pod.Name+": stored with NVIDIA_VISIBLE_DEVICES=all")
	case err == nil && lastEnv(stored.Spec.Containers[0], "NVIDIA_VISIBLE_DEVICES") != "void":
		l.unguarded = append(l.unguarded, pod.Name+": stored without void")
	case err == nil:
		l.admitted++
	case leak && isPolicyDenial(err):
		l.denied++
	default:
		l.failed[pod.Name] = err
	}
}

// isPolicyDenial: denied by gpuguard's policy, through the webhook or the
// CEL backstop, not a failed call.
func isPolicyDenial(err error) bool {
	msg := err.Error()
	return (strings.Contains(msg, "gpuguard denied") || strings.Contains(msg, "gpuguard backstop")) &&
		!strings.Contains(msg, "failed calling webhook")
}

func (l *load) counts() (admitted, denied, failed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.admitted, l.denied, len(l.failed)
}

// waitCounts waits until admitted and failed reach at least the given counts.
func (l *load) waitCounts(t *testing.T, admitted, failed int, what string) {
	t.Helper()
	err := framework.Poll(context.Background(), 2*time.Minute, func() (bool, error) {
		a, _, f := l.counts()
		return a >= admitted && f >= failed, nil
	})
	if err != nil {
		a, d, f := l.counts()
		t.Fatalf("%s: %d admitted, %d denied, %d failed; wanted at least %d admitted and %d failed", what, a, d, f, admitted, failed)
	}
}

// check asserts the invariants from the clients' view and from a final List,
// then deletes the run's pods.
func (l *load) check(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	for _, u := range l.unguarded {
		t.Errorf("unguarded admission: %s", u)
	}
	pods, err := l.client.CoreV1().Pods(reliabilityNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stored := 0
	for _, p := range pods.Items {
		if !strings.HasPrefix(p.Name, l.prefix+"-") {
			continue
		}
		stored++
		if strings.HasSuffix(p.Name, "-leak") || lastEnv(p.Spec.Containers[0], "NVIDIA_VISIBLE_DEVICES") != "void" {
			t.Errorf("stored unguarded: %s", p.Name)
		}
		if err, ok := l.failed[p.Name]; ok {
			t.Errorf("%s is stored although its client got an error: %v", p.Name, err)
		}
	}
	for name, err := range l.failed {
		if strings.Contains(err.Error(), "no valid gpuguard policy") {
			t.Errorf("%s: the webhook answered a verdict without a policy instead of an HTTP error: %v", name, err)
		}
	}
	if stored != l.admitted {
		t.Errorf("the final List holds %d pods of this run, the clients saw %d admitted", stored, l.admitted)
	}
	zero := int64(0)
	if err := l.client.CoreV1().Pods(reliabilityNS).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{}); err != nil {
		t.Error(err)
	}
}

// decisionLines counts the webhook's log lines of denials and mutations.
func decisionLines(t *testing.T) int {
	t.Helper()
	n := 0
	for line := range strings.SplitSeq(readFile(t, s.Webhook.Log), "\n") {
		if strings.Contains(line, `"msg":"admission deny"`) || strings.Contains(line, `"msg":"admission mutate"`) {
			n++
		}
	}
	return n
}

// expectOneLinePerDecision: each pod admitted was mutated once (void) and
// each leak denied once, each logged on one line, none sampled away.
func expectOneLinePerDecision(t *testing.T, linesBefore int, l *load) {
	t.Helper()
	a, d, _ := l.counts()
	if got := decisionLines(t) - linesBefore; got != a+d {
		t.Errorf("%d decision log lines for %d decisions (%d mutations, %d denials)", got, a+d, a, d)
	}
}

func TestReliability(t *testing.T) {
	if err := controlplane.EnsureNamespace(context.Background(), s.cp, reliabilityNS, nil); err != nil {
		t.Fatal(err)
	}
	t.Run("steady load from 16 clients", testSteadyLoad)
	t.Run("policy churn under load", testPolicyChurn)
	t.Run("crash under failurePolicy Fail", testCrashFailClosed)
	t.Run("crash under failurePolicy Ignore with the CEL backstop", testCrashFailOpen)
	t.Run("no valid policy at start under failurePolicy Ignore with the CEL backstop", testNoPolicyAtStart)
	t.Run("kubelet-style certificate rotation under load", testProjectedCertificateRotation)
	t.Run("malformed and oversized reviews", testHostileReviews)
}

func testSteadyLoad(t *testing.T) {
	l := newLoad(t, "steady")
	lines := decisionLines(t)
	start := time.Now()
	l.run(context.Background(), 16, 60, nil)
	took := time.Since(start)
	a, d, f := l.counts()
	t.Logf("reliability: steady load: %d creates from 16 clients in %v (%.0f/s): %d admitted with void, %d denied, %d client errors",
		a+d+f, took.Round(time.Millisecond), float64(a+d+f)/took.Seconds(), a, d, f)
	if f != 0 {
		t.Errorf("%d creates failed under steady load: %v", f, l.failed)
	}
	expectOneLinePerDecision(t, lines, l)
	l.check(t)
}
