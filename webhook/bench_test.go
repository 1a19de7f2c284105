package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/gpuguard/gpuguard/policy"
)

// decodeOnlyPath is served next to gpuguard's handlers in the benchmark: it decodes
// the review and the pod and allows, so the difference to /validate is what
// gpuguard's evaluation costs.
const decodeOnlyPath = "/decode-only"

func startBenchServer(b *testing.B) *server {
	dir := b.TempDir()
	pool := writeTestCerts(b, dir)
	port := freePort(b)
	o := testConfig(dir, port, "", "")
	source := loadedSource(b, "")
	srv := newReviewServer(o.Serving, o.Limits, logr.Discard())
	m := NewMetrics()
	registerHandlers(srv, newGate(DefaultLimits(), source.Loaded, nil, m), func(phase policy.Phase) *Handler {
		return &Handler{Phase: phase, Policies: source, Metrics: m, Log: logr.Discard()}
	})
	srv.Register(decodeOnlyPath, withRequestTimeout(&admission.Webhook{Handler: admission.HandlerFunc(
		func(_ context.Context, req admission.Request) admission.Response {
			p := &corev1.Pod{}
			if err := json.Unmarshal(req.Object.Raw, p); err != nil {
				return admission.Errored(http.StatusBadRequest, err)
			}
			return admission.Allowed("")
		})}))
	ctx, cancel := context.WithCancel(context.Background())
	s := &server{base: fmt.Sprintf("https://localhost:%d", port), pool: pool, cancel: cancel, done: make(chan error, 1)}
	s.client = newTLSClient(pool)
	go func() { s.done <- srv.Start(ctx) }()
	b.Cleanup(func() { s.stop(b) })
	deadline := time.Now().Add(30 * time.Second)
	for srv.StartedChecker()(nil) != nil {
		if time.Now().After(deadline) {
			b.Fatal("webhook server not started")
		}
		time.Sleep(10 * time.Millisecond) // polling interval of the start wait
	}
	return s
}

// benchReview is a typical pod CREATE, already mutated, as the validating webhook
// sees it: three containers, two of them without GPUs carrying void.
func benchReview(b *testing.B) []byte {
	p := pod(container("fetch", false, void), container("trainer", true), container("logs", false, void))
	p.Spec.InitContainers, p.Spec.Containers = p.Spec.Containers[:1], p.Spec.Containers[1:]
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: "bench", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Namespace: "team-a", Name: "p", Operation: admissionv1.Create, Object: raw(b, p)}})
	if err != nil {
		b.Fatal(err)
	}
	return body
}

// review posts one review and checks that it was allowed.
func (s *server) review(path string, body []byte) error {
	resp, err := s.client.Post(s.base+path+"?timeout=10s", "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var r admissionv1.AdmissionReview
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return err
	}
	if r.Response == nil || !r.Response.Allowed {
		return fmt.Errorf("%s: review not allowed: %+v", path, r.Response)
	}
	return nil
}

// BenchmarkWebhookServer measures the standalone server over keep-alive HTTPS from
// an in-process client, for gpuguard's validating handler and, in the same run and
// on the same server, a handler that only decodes and allows:
//   - throughput: b.N reviews from 8 concurrent clients, in reviews/s;
//   - latency: reviews sent open-loop at 1,000 per second for 2 s, p50 and p99.
func BenchmarkWebhookServer(b *testing.B) {
	s := startBenchServer(b)
	body := benchReview(b)
	for _, path := range []string{ValidatePath, decodeOnlyPath} {
		name := "gpuguard"
		if path == decodeOnlyPath {
			name = "decode-only"
		}
		b.Run("throughput/"+name, func(b *testing.B) { throughput(b, s, path, body) })
		// One fixed-rate run, whatever b.N: its length is set by the rate.
		b.Run("latency-1000rps/"+name, func(b *testing.B) { latencyAtRate(b, s, path, body, 1000, 2*time.Second) })
	}
}

func throughput(b *testing.B, s *server, path string, body []byte) {
	const clients = 8
	var next sync.Mutex
	remaining := b.N
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	start := time.Now()
	for range clients {
		wg.Go(func() {
			for {
				next.Lock()
				if remaining == 0 {
					next.Unlock()
					return
				}
				remaining--
				next.Unlock()
				if err := s.review(path, body); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "reviews/s")
}

// latencyAtRate sends reviews at a fixed rate, each from its own goroutine, so that
// a slow review does not delay the next one (no coordinated omission).
func latencyAtRate(b *testing.B, s *server, path string, body []byte, perSecond int, d time.Duration) {
	n := int(d.Seconds() * float64(perSecond))
	latencies := make([]time.Duration, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Second / time.Duration(perSecond))
	defer tick.Stop()
	for i := range n {
		<-tick.C
		wg.Go(func() {
			start := time.Now()
			if err := s.review(path, body); err != nil {
				errs <- err
			}
			latencies[i] = time.Since(start)
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	slices.Sort(latencies)
	b.ReportMetric(float64(latencies[n/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(latencies[n*99/100].Microseconds()), "p99-µs")
}
