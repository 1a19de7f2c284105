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
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuguard/gpuguard/e2e/framework"
)

// BenchmarkPodCreate measures what gpuguard adds to a pod create through the real
// API server, timed at the client (the API server's own webhook latency histogram
// starts at 5 ms, too coarse for this). Three arms alternate batch by batch in the
// same run: no webhooks; the same two webhook configurations pointed at a webhook
// that allows everything without looking (the price of any webhook); and gpuguard.
func BenchmarkPodCreate(b *testing.B) {
	const rounds, perBatch = 5, 50
	ctx := context.Background()
	noopPort := startNoopWebhook(b)
	arms := []struct {
		name string
		port int // 0: no webhooks
	}{{"without", 0}, {"noop", noopPort}, {"gpuguard", s.Webhook.Port}}
	latencies := map[string][]time.Duration{}
	defer func() {
		if err := s.pointWebhooks(ctx, s.Webhook.Port); err != nil {
			b.Fatal(err)
		}
	}()
	for round := range rounds {
		for _, arm := range arms {
			if err := s.pointWebhooks(ctx, arm.port); err != nil {
				b.Fatal(err)
			}
			for i := range perBatch {
				p := plainPod(fmt.Sprintf("bench-%s-%d-%d", arm.name, round, i))
				p.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "busybox"}}
				p.Spec.Containers = append(p.Spec.Containers, gpuContainer("train"))
				start := time.Now()
				if _, err := s.cp.Client.CoreV1().Pods(enforceNS).Create(ctx, p, metav1.CreateOptions{}); err != nil {
					b.Fatal(err)
				}
				latencies[arm.name] = append(latencies[arm.name], time.Since(start))
			}
			if err := s.cp.Client.CoreV1().Pods(enforceNS).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
				b.Fatal(err)
			}
		}
	}
	base, _ := percentiles(latencies["without"])
	for _, arm := range arms {
		p50, p99 := percentiles(latencies[arm.name])
		b.ReportMetric(float64(p50.Microseconds()), "p50-"+arm.name+"-µs")
		b.ReportMetric(float64(p99.Microseconds()), "p99-"+arm.name+"-µs")
		if arm.port != 0 {
			b.ReportMetric(float64(p50)/float64(base), "p50-ratio-"+arm.name)
		}
	}
}

// pointWebhooks installs gpuguard's webhook configurations pointed at port, or
// removes them for port 0, and waits until the API server acts accordingly.
func (s *suite) pointWebhooks(ctx context.Context, port int) error {
	if port == 0 {
		if err := s.Configs.Remove(ctx, s.cp.Client); err != nil {
			return err
		}
	} else {
		s.Configs.PointAt(port, s.CA.PEM)
		if err := s.Configs.Install(ctx, s.cp.Client); err != nil {
			return err
		}
	}
	// gpuguard injects void; no webhook and the no-op webhook do not.
	wantVoid := port == s.Webhook.Port
	return framework.Poll(ctx, time.Minute, func() (bool, error) {
		p, err := s.cp.Client.CoreV1().Pods(enforceNS).Create(ctx, plainPod("probe"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil && (len(p.Spec.Containers[0].Env) > 0) == wantVoid, nil
	})
}

// startNoopWebhook serves, with the suite's certificate, a webhook that allows every
// review after decoding it, and returns its port.
func startNoopWebhook(b *testing.B) int {
	cert, err := tls.LoadX509KeyPair(filepath.Join(s.CertDir, "tls.crt"), filepath.Join(s.CertDir, "tls.key"))
	if err != nil {
		b.Fatal(err)
	}
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}})
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	return l.Addr().(*net.TCPAddr).Port
}

func percentiles(d []time.Duration) (p50, p99 time.Duration) {
	slices.Sort(d)
	return d[len(d)/2], d[len(d)*99/100]
}
