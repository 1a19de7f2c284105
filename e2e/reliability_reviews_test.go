//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuguard/gpuguard/e2e/framework"
	"github.com/gpuguard/gpuguard/e2e/framework/controlplane"
)

// reviewOf wraps an object as an AdmissionReview of a pod CREATE.
func reviewOf(uid, object string) string {
	return `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"` + uid + `",` +
		`"kind":{"group":"","version":"v1","kind":"Pod"},"resource":{"group":"","version":"v1","resource":"pods"},` +
		`"namespace":"` + enforceNS + `","operation":"CREATE","userInfo":{"username":"mallory"},"object":` + object + `}}`
}

// floodedPodJSON is a pod with n NVIDIA_VISIBLE_DEVICES=all entries: about
// 2.9 MB at 60,000, which the API server accepts.
func floodedPodJSON(t *testing.T, n int) string {
	t.Helper()
	p := plainPod("flood")
	p.Namespace = enforceNS
	for range n {
		p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, allGPUs)
	}
	data, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// hostileReviews are bodies nobody but an attacker sends to the webhook port.
func hostileReviews(t *testing.T) map[string]string {
	deep := strings.Repeat("[", 100000) + strings.Repeat("]", 100000)
	return map[string]string{
		"empty":                 "",
		"null":                  "null",
		"not JSON":              "\x00\xff{{",
		"truncated":             reviewOf("u-trunc", `{"metadata":{"name":"x"`)[:120],
		"request null":          `{"request":null}`,
		"uid a number":          `{"request":{"uid":7,"operation":"CREATE","kind":{"kind":"Pod"}}}`,
		"object a string":       reviewOf("u-str", `"pod"`),
		"containers a string":   reviewOf("u-types", `{"metadata":{"name":"x"},"spec":{"containers":"all"}}`),
		"deeply nested":         reviewOf("u-deep", `{"metadata":{"name":"x","annotations":{"a":`+deep+`}}}`),
		"unknown operation":     strings.Replace(reviewOf("u-op", `{"metadata":{"name":"x"}}`), `"CREATE"`, `"EXPLODE"`, 1),
		"invalid UTF-8 env":     reviewOf("u-utf8", `{"metadata":{"name":"x"},"spec":{"containers":[{"name":"c","env":[{"name":"NVIDIA_\xff","value":"all"}]}]}}`),
		"over 7 MiB":            reviewOf("u-big", `{"metadata":{"name":"x","annotations":{"a":"`+strings.Repeat("x", 8<<20)+`"}}}`),
		"60,000 offending envs": reviewOf("u-flood", floodedPodJSON(t, 60000)),
	}
}

func webhookClient() *http.Client {
	return &http.Client{Timeout: time.Minute, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: s.CA.Pool(), ServerName: "localhost"}, MaxIdleConnsPerHost: 32}}
}

// postReview posts a body to a webhook path; it returns the HTTP status and
// the admission response, if one came.
func postReview(c *http.Client, path, body string) (int, *struct {
	UID     string          `json:"uid"`
	Allowed bool            `json:"allowed"`
	Status  metav1.Status   `json:"status"`
	Patch   json.RawMessage `json:"patch"`
}, error) {
	resp, err := c.Post(fmt.Sprintf("https://127.0.0.1:%d%s", s.Webhook.Port, path), "application/json", strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return resp.StatusCode, nil, err
	}
	var review struct {
		Response *struct {
			UID     string          `json:"uid"`
			Allowed bool            `json:"allowed"`
			Status  metav1.Status   `json:"status"`
			Patch   json.RawMessage `json:"patch"`
		} `json:"response"`
	}
	if err := json.Unmarshal(data, &review); err != nil || review.Response == nil {
		return resp.StatusCode, nil, fmt.Errorf("HTTP 200 without an AdmissionReview response: %.200s", data)
	}
	return resp.StatusCode, review.Response, nil
}

// testHostileReviews posts malformed and oversized reviews straight to the
// webhook port: each gets a client error or a proper verdict, never a
// server error; then 16 reviews of the 2.9 MB worst case at once, three
// times, stay under the chart's memory limit; the webhook stays ready and
// nothing panics.
func testHostileReviews(t *testing.T) {
	c := webhookClient()
	tried := 0
	for name, body := range hostileReviews(t) {
		for _, path := range []string{"/mutate", "/validate"} {
			tried++
			code, resp, err := postReview(c, path, body)
			switch {
			case err != nil:
				t.Errorf("%s %s: %v", name, path, err)
			case code >= 500:
				t.Errorf("%s %s: HTTP %d", name, path, code)
			case code == http.StatusOK && resp.UID == "":
				t.Errorf("%s %s: a verdict without the request's uid", name, path)
			case code == http.StatusOK && strings.HasPrefix(name, "60,000") && (resp.Allowed || len(resp.Status.Message) > 4096):
				t.Errorf("%s %s: allowed=%v with a %d-byte message, want a bounded denial", name, path, resp.Allowed, len(resp.Status.Message))
			}
		}
	}
	worstCase(t, c)
	if err := s.Webhook.WaitReady(context.Background(), 10*time.Second); err != nil {
		t.Errorf("the webhook is not ready after the hostile reviews: %v", err)
	}
	if log := readFile(t, s.Webhook.Log); strings.Contains(log, "panic") {
		t.Errorf("the webhook's log mentions a panic:\n%s", framework.Tail(s.Webhook.Log))
	}
	t.Logf("reliability: %d malformed or oversized reviews (%d kinds, on both paths): no server error, no panic", tried, tried/2)
}

// worstCase sends 16 reviews of the largest offending pod at once, three
// times: each is denied with a bounded message or turned away with 429, and
// the webhook's peak RSS stays under the chart's memory limit.
func worstCase(t *testing.T, c *http.Client) {
	body := reviewOf("u-worst", floodedPodJSON(t, 60000))
	var mu sync.Mutex
	codes := map[int]int{}
	var bad []string
	start := time.Now()
	for range 3 {
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				code, resp, err := postReview(c, "/validate", body)
				mu.Lock()
				defer mu.Unlock()
				codes[code]++
				if err != nil || (code == http.StatusOK && resp.Allowed) || (code != http.StatusOK && code != http.StatusTooManyRequests) {
					bad = append(bad, fmt.Sprintf("HTTP %d %v", code, err))
				}
			})
		}
		wg.Wait()
	}
	took := time.Since(start)
	for _, b := range bad {
		t.Errorf("worst-case review: %s", b)
	}
	rss, err := s.Webhook.PeakRSS()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("reliability: 3×16 concurrent reviews of a %.1f MB pod with 60,000 offending entries in %v: %d denied (bounded), %d turned away (429); peak RSS %d MiB (limit %d MiB)",
		float64(len(body))/1e6, took.Round(time.Millisecond), codes[http.StatusOK], codes[http.StatusTooManyRequests], rss>>20, controlplane.WebhookMemoryLimit>>20)
	if rss >= controlplane.WebhookMemoryLimit {
		t.Errorf("peak RSS %d MiB reached the chart's memory limit of %d MiB", rss>>20, controlplane.WebhookMemoryLimit>>20)
	}
}
