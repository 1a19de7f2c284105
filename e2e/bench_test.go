//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuguard/gpuguard/e2e/framework"
)

// BenchmarkPodCreate measures what gpuguard adds to a pod create through the real
// API server, timed at the client (the API server's own webhook latency histogram
// starts at 5 ms, too coarse for this). The arms alternate batch by batch in the
// same run: no policy; the two webhook configurations pointed at a webhook that
// allows everything without looking (the price of any webhook); gpuguard's
// webhook; the CEL backstop alone; and both.
func BenchmarkPodCreate(b *testing.B) {
	const rounds, perBatch = 5, 50
	ctx := context.Background()
	noop := startNoopWebhook(b)
	arms := []arm{{"without", 0, false}, {"noop-webhook", noop.port, false}, {"webhook", s.Webhook.Port, false},
		{"cel", 0, true}, {"webhook+cel", s.Webhook.Port, true}}
	latencies := map[string][]time.Duration{}
	defer func() {
		if err := s.arrange(ctx, arm{port: s.Webhook.Port}, noop); err != nil {
			b.Fatal(err)
		}
	}()
	for round := range rounds {
		for _, a := range arms {
			if err := s.arrange(ctx, a, noop); err != nil {
				b.Fatalf("%s: %v", a.name, err)
			}
			for i := range perBatch {
				p := plainPod(fmt.Sprintf("bench-%s-%d-%d", strings.ReplaceAll(a.name, "+", "-"), round, i))
				p.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "busybox"}}
				p.Spec.Containers = append(p.Spec.Containers, gpuContainer("train"))
				start := time.Now()
				if _, err := s.cp.Client.CoreV1().Pods(enforceNS).Create(ctx, p, metav1.CreateOptions{}); err != nil {
					b.Fatal(err)
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

// arm is one configuration of the benchmark: webhooks pointed at port (0: none)
// and the CEL backstop on or off.
type arm struct {
	name     string
	port     int
	backstop bool
}

// arrange sets up an arm and waits until the API server acts accordingly.
func (s *suite) arrange(ctx context.Context, a arm, noop *noopWebhook) error {
	if err := s.Configs.Remove(ctx, s.cp.Client); err != nil {
		return err
	}
	if err := s.installBackstop(ctx, a.backstop); err != nil {
		return err
	}
	pods := s.cp.Client.CoreV1().Pods(enforceNS)
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	if a.backstop {
		if err := s.waitBackstop(ctx); err != nil {
			return err
		}
	} else if err := framework.Poll(ctx, time.Minute, func() (bool, error) {
		p, err := pods.Create(ctx, plainPod("probe"), dry)
		return err == nil && len(p.Spec.Containers[0].Env) == 0, nil
	}); err != nil {
		return err
	}
	if a.port == 0 {
		return nil
	}
	s.Configs.PointAt(a.port, s.CA.PEM)
	if err := s.Configs.Install(ctx, s.cp.Client); err != nil {
		return err
	}
	if a.port == s.Webhook.Port {
		return s.waitEnforcing(ctx)
	}
	seen := noop.calls.Load()
	return framework.Poll(ctx, time.Minute, func() (bool, error) {
		_, _ = pods.Create(ctx, plainPod("probe"), dry)
		return noop.calls.Load() > seen, nil
	})
}

// noopWebhook allows every review after decoding it, and counts them.
type noopWebhook struct {
	port  int
	calls atomic.Int64
}

// startNoopWebhook serves a no-op webhook with the suite's certificate.
func startNoopWebhook(b *testing.B) *noopWebhook {
	n := &noopWebhook{}
	cert, err := tls.LoadX509KeyPair(filepath.Join(s.CertDir, "tls.crt"), filepath.Join(s.CertDir, "tls.key"))
	if err != nil {
		b.Fatal(err)
	}
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}})
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.calls.Add(1)
		var review admissionv1.AdmissionReview
		if err := json.NewDecoder(r.Body).Decode(&review); err != nil || review.Request == nil {
			http.Error(w, "bad review", http.StatusBadRequest)
			return
		}
		review.Response = &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: true}
		review.Request = nil
		_ = json.NewEncoder(w).Encode(&review)
	})}
	go func() { _ = srv.Serve(l) }()
	b.Cleanup(func() { _ = srv.Close() })
	n.port = l.Addr().(*net.TCPAddr).Port
	return n
}

func percentiles(d []time.Duration) (p50, p99 time.Duration) {
	slices.Sort(d)
	return d[len(d)/2], d[len(d)*99/100]
}
