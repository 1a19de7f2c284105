package webhook

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/zapr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/gpuguard/gpuguard/policy"
)

// blocking is a handler that holds every request until release is closed.
type blocking struct {
	entered chan struct{}
	release chan struct{}
}

func (b *blocking) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	b.entered <- struct{}{}
	<-b.release
	w.WriteHeader(http.StatusOK)
}

func serveGated(g *gate, body string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/validate", strings.NewReader(body))
	g.wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })).ServeHTTP(rec, req)
	return rec
}

// TestGateAnswersHTTPErrorsNotVerdicts: without a policy, while stopping,
// and over its limits, the webhook answers an HTTP error, which the API
// server treats as a failed call (failurePolicy), never a denial.
func TestGateAnswersHTTPErrorsNotVerdicts(t *testing.T) {
	m := NewMetrics()
	loaded := false
	stopping := make(chan struct{})
	g := newGate(Limits{MaxReviews: 1, MaxReviewBytes: 100, Wait: 50 * time.Millisecond}, func() bool { return loaded }, stopping, m)

	if rec := serveGated(g, "{}"); rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
		t.Errorf("no policy: HTTP %d, want 503 with Retry-After", rec.Code)
	}
	loaded = true
	if rec := serveGated(g, "{}"); rec.Code != http.StatusOK {
		t.Errorf("with a policy: HTTP %d", rec.Code)
	}

	// One review in flight fills MaxReviews: the next waits, then gets 429.
	b := &blocking{entered: make(chan struct{}), release: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Go(func() {
		g.wrap(b).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/validate", strings.NewReader("{}")))
	})
	<-b.entered
	if rec := serveGated(g, "{}"); rec.Code != http.StatusTooManyRequests {
		t.Errorf("over MaxReviews: HTTP %d, want 429", rec.Code)
	}
	close(b.release)
	wg.Wait()
	if rec := serveGated(g, strings.Repeat("x", 101)); rec.Code != http.StatusTooManyRequests {
		t.Errorf("a body over MaxReviewBytes: HTTP %d, want 429", rec.Code)
	}
	if rec := serveGated(g, "{}"); rec.Code != http.StatusOK {
		t.Errorf("after the load: HTTP %d", rec.Code)
	}

	close(stopping)
	if rec := serveGated(g, "{}"); rec.Code != http.StatusServiceUnavailable {
		t.Errorf("stopping: HTTP %d, want 503", rec.Code)
	}
	for reason, want := range map[string]float64{"no-policy": 1, "overloaded": 2, "stopping": 1} {
		if got := testutil.ToFloat64(m.Refused.WithLabelValues(reason)); got != want {
			t.Errorf("refused{reason=%s} = %v, want %v", reason, got, want)
		}
	}
}

func TestLimitsValidate(t *testing.T) {
	if errs := DefaultLimits().validate(); len(errs) > 0 {
		t.Fatal(errs)
	}
	for _, l := range []Limits{{MaxReviews: 0, MaxReviewBytes: 16 << 20}, {MaxReviews: 1, MaxReviewBytes: 1 << 20}} {
		if errs := l.validate(); len(errs) == 0 {
			t.Errorf("%+v accepted", l)
		}
	}
}

// TestFloodedPodGetsABoundedDenial: a pod with 60,000 offending entries (what
// the API server accepts) is denied with a message of a few kilobytes, and
// its log line names each rule once.
func TestFloodedPodGetsABoundedDenial(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "flood", Namespace: "team"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i"}}}}
	for range 60000 {
		pod.Spec.Containers[0].Env = append(pod.Spec.Containers[0].Env, corev1.EnvVar{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"})
	}
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	h := &Handler{Phase: policy.Mutating, Policies: loadedSource(t, ""), Metrics: NewMetrics(), Log: bufferLogger(&logs)}
	resp := h.Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "u", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Operation: admissionv1.Create,
		Namespace: "team", Object: runtime.RawExtension{Raw: raw}}})
	if resp.Allowed {
		t.Fatal("allowed")
	}
	msg := resp.Result.Message
	if len(msg) > 4096 || !strings.Contains(msg, "and 59980 more violations [device-env]") {
		t.Errorf("denial of %d bytes, want under 4 KiB ending in the count of the rest:\n%s", len(msg), msg)
	}
	if got := testutil.ToFloat64(h.Metrics.Decisions.WithLabelValues("mutating", "CREATE", "Pod", "deny", "device-env")); got != 1 {
		t.Errorf("the decision was counted %v times for its rule, want once", got)
	}
	if !strings.Contains(logs.String(), `"rules":["device-env"]`) || !strings.Contains(logs.String(), `"findings":60000`) {
		t.Errorf("log line: %s", logs.String())
	}
}

// bufferLogger logs JSON lines into buf, as the webhook does to stderr.
func bufferLogger(buf *bytes.Buffer) logr.Logger {
	core := zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(buf), zapcore.DebugLevel)
	return zapr.NewLogger(zap.New(core))
}

// TestIdleConnectionsHoldNoReviewBytes: three connections that declare
// 7, 7 and 2 MiB bodies and send none (16 MiB, all of MaxReviewBytes) do not
// turn other reviews away, and are cut off at the body deadline. When the
// gate reserved the declared length up front, every other review got 429
// for as long as they stayed open.
func TestIdleConnectionsHoldNoReviewBytes(t *testing.T) {
	g := newGate(Limits{MaxReviews: 16, MaxReviewBytes: 16 << 20, Wait: 100 * time.Millisecond, BodyRead: 2 * time.Second},
		func() bool { return true }, make(chan struct{}), NewMetrics())
	srv := httptest.NewUnstartedServer(g.wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })))
	var active atomic.Int32 // connections that have sent a request's first bytes
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateActive {
			active.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	var idle []net.Conn
	for _, size := range []int{7 << 20, 7 << 20, 2 << 20} {
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := fmt.Fprintf(c, "POST /validate HTTP/1.1\r\nHost: gpuguard\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", size); err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
	}
	if !waitFor(10*time.Second, func() bool { return active.Load() >= 3 }) {
		t.Fatalf("%d of the 3 idle connections reached the server", active.Load())
	}
	// The idle requests' handlers have started: wait until they could
	// have reserved their declared bytes (the whole limit), if they do.
	_ = waitFor(time.Second, func() bool {
		if g.bytes.TryAcquire(16 << 20) {
			g.bytes.Release(16 << 20)
			return false
		}
		return true
	})
	resp, err := http.Post(srv.URL+"/validate", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("a review beside three idle connections: HTTP %d, want 200", resp.StatusCode)
	}
	// The idle connections are answered and closed at the body deadline.
	for _, c := range idle {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || !strings.Contains(line, "408") {
			t.Errorf("an idle connection got %q (%v), want HTTP 408 at the body deadline", line, err)
		}
	}
}

// waitFor polls cond until it holds or timeout passes; false on timeout.
func waitFor(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// TestDrainingRetiresConnections: once the shutdown delay begins, every
// answer closes its keep-alive connection, so the API server (which reuses
// idle connections and never retries a webhook call) has none left for the
// stopping server to close under a request it is writing.
func TestDrainingRetiresConnections(t *testing.T) {
	draining := make(chan struct{})
	g := newGate(DefaultLimits(), func() bool { return true }, nil, NewMetrics())
	g.draining = draining
	srv := httptest.NewServer(g.wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })))
	defer srv.Close()
	client := srv.Client()
	reused := func() (bool, bool) {
		t.Helper()
		var got bool
		trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) { got = info.Reused }}
		req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodPost, srv.URL+"/validate", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return got, resp.Close
	}
	reused()
	if again, _ := reused(); !again {
		t.Fatal("before draining, the client should reuse its keep-alive connection")
	}
	close(draining)
	if _, closes := reused(); !closes {
		t.Error("while draining, the answer does not say Connection: close")
	}
	if again, _ := reused(); again {
		t.Error("while draining, the client reused a connection the server should have retired")
	}
}
