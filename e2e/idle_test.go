//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestIdleConnectionsDoNotChangeAnswers: anything that reaches the webhook's
// port can open TLS connections that declare large review bodies and send
// none. While three such connections (7 + 7 + 2 MiB declared) stay open,
// the API server's reviews of leaking pods are still answered by the
// webhooks themselves, with their denial, not a failure to call them or the
// backstop's; and the
// idle connections are closed at the body deadline. (The webhook once
// reserved declared lengths: every review got HTTP 429 meanwhile; the
// in-process twin, TestIdleTLSConnectionsDoNotStarveReviews, failed so.)
func TestIdleConnectionsDoNotChangeAnswers(t *testing.T) {
	ctx := context.Background()
	target := ""
	for _, w := range s.Configs.Validating.Webhooks {
		if w.Name == "validate.pods.gpuguard.io" && w.ClientConfig.URL != nil {
			target = *w.ClientConfig.URL
		}
	}
	u, err := url.Parse(target)
	if err != nil || target == "" {
		t.Fatalf("the suite's pod validating webhook has no URL: %q (%v)", target, err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(s.CA.PEM)
	var idle []*tls.Conn
	for _, size := range []int{7 << 20, 7 << 20, 2 << 20} {
		c, err := tls.Dial("tcp", u.Host, &tls.Config{RootCAs: pool, ServerName: "localhost", NextProtos: []string{"http/1.1"}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", u.Path, size); err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
	}
	pods, dry := s.cp.Client.CoreV1().Pods(enforceNS), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	for i := range 5 {
		_, err := pods.Create(ctx, leakingPod(), dry)
		if err == nil || !strings.Contains(err.Error(), `.pods.gpuguard.io" denied the request: gpuguard denied this pod`) {
			t.Fatalf("review %d beside idle connections: %v, want the webhook's own denial", i, err)
		}
	}
	for _, c := range idle {
		_ = c.SetReadDeadline(time.Now().Add(15 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || !strings.Contains(line, "408") {
			t.Errorf("an idle connection got %q (%v), want HTTP 408 at the body deadline", line, err)
		}
	}
}
