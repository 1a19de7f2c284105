package webhook

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/internal/manifest"
	"github.com/gpuguard/gpuguard/policy"
)

// server is a standalone gpuguard webhook running in this process on real TLS.
type server struct {
	base, probes string
	client       *http.Client
	pool         *x509.CertPool
	cancel       context.CancelFunc
	done         chan error
}

// newTLSClient keeps connections alive, as the API server does.
func newTLSClient(pool *x509.CertPool) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool}, MaxIdleConnsPerHost: 64}}
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// testConfig serves standalone on loopback with the certificates in dir,
// the probes on probeAddr (empty: off) and no metrics.
func testConfig(dir string, port int, policyFile, probeAddr string) Config {
	c := DefaultConfig()
	c.Serving = Serving{Host: "127.0.0.1", Port: port, CertDir: dir, CertName: "tls.crt", KeyName: "tls.key"}
	c.Policy.File = policyFile
	c.Observability = Observability{ProbeAddr: probeAddr}
	c.Log = logr.Discard()
	return c
}

func startServer(t testing.TB, policyFile string) *server {
	t.Helper()
	return startServerWith(t, policyFile, nil)
}

// startServerWith starts a server whose configuration edit has changed.
func startServerWith(t testing.TB, policyFile string, edit func(*Config)) *server {
	t.Helper()
	dir := t.TempDir()
	pool := writeTestCerts(t, dir)
	port, probePort := freePort(t), freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	s := &server{
		base:   fmt.Sprintf("https://localhost:%d", port),
		probes: fmt.Sprintf("http://127.0.0.1:%d", probePort),
		client: newTLSClient(pool),
		pool:   pool, cancel: cancel, done: make(chan error, 1),
	}
	go func() {
		c := testConfig(dir, port, policyFile, fmt.Sprintf("127.0.0.1:%d", probePort))
		if edit != nil {
			edit(&c)
		}
		s.done <- Run(ctx, c)
	}()
	t.Cleanup(func() { s.stop(t) })
	s.waitReady(t)
	return s
}

// waitReady polls /readyz until the policy is loaded and the TLS server answers.
func (s *server) waitReady(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-s.done:
			t.Fatalf("server stopped: %v", err)
		default:
		}
		if resp, err := http.Get(s.probes + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(20 * time.Millisecond) // polling interval of the readiness wait
	}
	t.Fatal("webhook not ready within 30s")
}

func (s *server) stop(t testing.TB) {
	if s.cancel == nil {
		return
	}
	s.cancel()
	s.cancel = nil
	select {
	case err := <-s.done:
		if err != nil {
			t.Errorf("server did not stop cleanly: %v", err)
		}
	case <-time.After(70 * time.Second):
		t.Error("server did not stop within its shutdown timeout")
	}
}

func (s *server) post(t testing.TB, path string, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	t.Helper()
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}, Request: req})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := s.client.Post(s.base+path+"?timeout=10s", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var review admissionv1.AdmissionReview
	if err := json.NewDecoder(resp.Body).Decode(&review); err != nil || review.Response == nil {
		t.Fatalf("%s: no AdmissionReview response (HTTP %d): %v", path, resp.StatusCode, err)
	}
	return review.Response
}

func createRequest(t testing.TB, d manifest.Document, obj runtime.Object) *admissionv1.AdmissionRequest {
	ns := d.Meta.Namespace
	if ns == "" {
		ns = "default"
	}
	return &admissionv1.AdmissionRequest{
		UID: types.UID("uid-" + d.Meta.Name), Kind: metav1.GroupVersionKind(d.GVK), Namespace: ns, Name: d.Meta.Name,
		Operation: admissionv1.Create, Object: raw(t, obj),
	}
}

func TestServesOverTLS(t *testing.T) {
	s := startServer(t, BuiltinPolicy)
	leak := pod(container("app", false, all))
	d := manifest.Document{GVK: leak.GroupVersionKind(), Meta: leak.ObjectMeta}
	resp := s.post(t, ValidatePath, createRequest(t, d, leak))
	if resp.Allowed || resp.UID != "uid-p" || !strings.Contains(resp.Result.Message, "[device-env]") {
		t.Errorf("leak over TLS: %+v", resp)
	}

	old := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: s.pool, MaxVersion: tls.VersionTLS11}}}
	if _, err := old.Get(s.base + ValidatePath); err == nil {
		t.Error("a TLS 1.1 client must be refused")
	}
	h2 := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: s.pool}, ForceAttemptHTTP2: true}}
	r, err := h2.Post(s.base+ValidatePath, "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.ProtoMajor != 1 {
		t.Errorf("HTTP/2 must be off by default, got %s", r.Proto)
	}

	for name, body := range map[string]string{
		"garbage":      "not json",
		"no request":   `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`,
		"no uid":       `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"operation":"CREATE","kind":{"kind":"Pod"}}}`,
		"no operation": `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","kind":{"kind":"Pod"}}}`,
	} {
		resp, err := s.client.Post(s.base+MutatePath, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var review admissionv1.AdmissionReview
		if resp.StatusCode != http.StatusBadRequest || json.Unmarshal(msg, &review) == nil && review.Response != nil {
			t.Errorf("%s: want HTTP 400 and no admission verdict, got %d %s", name, resp.StatusCode, msg)
		}
		if !strings.Contains(string(msg), "admission review:") {
			t.Errorf("%s: the error does not say what is wrong: %s", name, msg)
		}
	}

	big := `{"request":{"uid":"u","operation":"CREATE","kind":{"kind":"Pod"},"object":"` + strings.Repeat("x", maxReviewBytes) + `"}}`
	tooBig, err := s.client.Post(s.base+MutatePath, "application/json", strings.NewReader(big))
	if err != nil {
		t.Fatal(err)
	}
	tooBig.Body.Close()
	if tooBig.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("a review over %d bytes: HTTP %d, want 413 (no verdict)", maxReviewBytes, tooBig.StatusCode)
	}

	s.stop(t) // graceful: Run returns nil
}

// TestExamplesMatchCheck posts every shipped example as the API server would: the
// mutating webhook, its patch applied, then the validating webhook; the decisions,
// patches and warnings must be what the engine gives `gpuguard check`.
func TestExamplesMatchCheck(t *testing.T) {
	s := startServer(t, BuiltinPolicy)
	docs, errs := manifest.Read([]string{filepath.Join("..", "examples")}, nil)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	engine, err := policy.New(config.Default())
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, d := range docs {
		if d.Object == nil || !policy.Supported(d.Object) {
			continue
		}
		checked++
		t.Run(d.Location(), func(t *testing.T) {
			want, err := engine.Admit(context.Background(), policy.Request{Operation: admissionv1.Create, Namespace: d.Meta.Namespace, Object: d.Object})
			if err != nil {
				t.Fatal(err)
			}
			allowed, patch, warnings, message := s.admit(t, d)
			if allowed != want.Allowed {
				t.Fatalf("webhook allowed=%v, check allowed=%v", allowed, want.Allowed)
			}
			wantPatch, _ := json.Marshal(want.Patch)
			if gotPatch, _ := json.Marshal(patch); string(gotPatch) != string(wantPatch) {
				t.Errorf("patch\n webhook: %s\n   check: %s", gotPatch, wantPatch)
			}
			if !slices.Equal(warnings, want.WarningStrings()) {
				t.Errorf("warnings\n webhook: %q\n   check: %q", warnings, want.WarningStrings())
			}
			for _, v := range want.Violations {
				if line := v.String(); !strings.Contains(message, line) {
					t.Errorf("denial %q lacks %q", message, line)
				}
			}
		})
	}
	if checked < 8 {
		t.Errorf("only %d examples evaluated", checked)
	}
}

// admit runs the two webhook phases over TLS the way the API server chains them.
func (s *server) admit(t *testing.T, d manifest.Document) (allowed bool, patch []jsonpatch.Operation, warnings []string, message string) {
	mutated := s.post(t, MutatePath, createRequest(t, d, d.Object))
	warnings = append(warnings, mutated.Warnings...)
	if !mutated.Allowed {
		return false, []jsonpatch.Operation{}, warnings, mutated.Result.Message
	}
	patch = []jsonpatch.Operation{}
	obj := d.Object
	if len(mutated.Patch) > 0 {
		if err := json.Unmarshal(mutated.Patch, &patch); err != nil {
			t.Fatal(err)
		}
		var err error
		if obj, err = policy.ApplyPatch(d.Object, patch); err != nil {
			t.Fatal(err)
		}
	}
	validated := s.post(t, ValidatePath, createRequest(t, d, obj))
	warnings = append(warnings, validated.Warnings...)
	if !validated.Allowed {
		message = validated.Result.Message
	}
	return validated.Allowed, patch, warnings, message
}

// TestIdleTLSConnectionsDoNotStarveReviews: on the real server and real TLS,
// three connections that declare 7, 7 and 2 MiB review bodies (the whole
// default byte limit) and send none leave other reviews their answers, and
// are answered 408 at the body deadline. Reserving declared lengths, the
// gate once turned every review away while they stayed open.
func TestIdleTLSConnectionsDoNotStarveReviews(t *testing.T) {
	s := startServer(t, BuiltinPolicy)
	addr := strings.TrimPrefix(s.base, "https://")
	var idle []*tls.Conn
	for _, size := range []int{7 << 20, 7 << 20, 2 << 20} {
		c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: s.pool, NextProtos: []string{"http/1.1"}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: gpuguard\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", ValidatePath, size); err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
	}
	leak := pod(container("app", false, all))
	d := manifest.Document{GVK: leak.GroupVersionKind(), Meta: leak.ObjectMeta}
	// Each review is answered with a verdict, not the gate's 429, while
	// the idle connections stay open.
	for range 5 {
		if resp := s.post(t, ValidatePath, createRequest(t, d, leak)); resp.Allowed || !strings.Contains(resp.Result.Message, "[device-env]") {
			t.Fatalf("a review beside idle connections: %+v", resp)
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

// TestOversizedReviewsGetTheirAnswer: a review megabytes over the limit,
// sent whole before its sender reads, as a busy sender does, is answered
// 413, not a reset connection. The server once stopped reading at the
// limit and closed the connection under the sender's writes, and the
// reset threw the answer away unread.
func TestOversizedReviewsGetTheirAnswer(t *testing.T) {
	s := startServer(t, BuiltinPolicy)
	addr := strings.TrimPrefix(s.base, "https://")
	body := `{"request":{"uid":"u","operation":"CREATE","kind":{"kind":"Pod"},"object":"` + strings.Repeat("x", maxReviewBytes+8<<20) + `"}}`
	for i := range 3 {
		c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: s.pool, NextProtos: []string{"http/1.1"}})
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: gpuguard\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", ValidatePath, len(body), body); err != nil {
			c.Close()
			t.Fatalf("oversized review %d: writing it: %v, want the whole body read and HTTP 413", i, err)
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if err != nil || !strings.Contains(line, "413") {
			t.Fatalf("oversized review %d: got %q (%v), want HTTP 413", i, line, err)
		}
	}
}

// TestKAIFractionsRefusedWithoutGuard: a webhook that applies no backstop
// refuses a policy that accepts KAI's fractions, naming the guard it
// lacks, instead of letting fraction containers read GPUs from ConfigMaps
// any tenant may write.
func TestKAIFractionsRefusedWithoutGuard(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "policy.yaml")
	doc := "apiVersion: gpuguard.io/v1alpha1\nkind: GPUGuardPolicy\nmetadata:\n  name: kai\nspec:\n  integrations:\n    kaiScheduler:\n      fractions: true\n"
	if err := os.WriteFile(file, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	writeTestCerts(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a server that accepts it runs until then
	defer cancel()
	err := Run(ctx, testConfig(dir, freePort(t), file, fmt.Sprintf("127.0.0.1:%d", freePort(t))))
	if !errors.Is(err, ErrKAIFractionsNeedGuard) {
		t.Fatalf("Run with KAI fractions and no backstop: %v, want %v", err, ErrKAIFractionsNeedGuard)
	}
}

// TestConfigValidate: Validate checks every setting and the settings that
// only mean something together, and names each by its place in Config,
// never by a flag.
func TestConfigValidate(t *testing.T) {
	base := DefaultConfig()
	base.RestConfig = &rest.Config{Host: "https://x"}
	if err := base.Validate(); err != nil {
		t.Fatalf("DefaultConfig: %v", err)
	}
	for _, tc := range []struct {
		name    string
		edit    func(c *Config)
		wantErr string
	}{
		{"all, the default", func(c *Config) {}, ""},
		{"serve", func(c *Config) { c.Role = RoleServe }, ""},
		{"serve with the pre-filter", func(c *Config) {
			c.Role = RoleServe
			c.Prefilter.Webhooks = []string{"w"}
			c.WebhookConfigurations.Mutating = "m"
		}, "role: serve writes nothing"},
		{"serve with the audit", func(c *Config) { c.Role = RoleServe; c.Audit.Interval = time.Minute }, "role: serve writes nothing"},
		{"control", func(c *Config) {
			c.Role = RoleControl
			c.Prefilter.Webhooks = []string{"w"}
			c.WebhookConfigurations.Mutating = "m"
		}, ""},
		{"control standalone", func(c *Config) { c.Role = RoleControl; c.Policy.File = BuiltinPolicy }, "role: control keeps objects in a cluster and needs an API server"},
		{"unknown role", func(c *Config) { c.Role = "writer" }, `role: "writer": want all, serve or control`},
		{"port", func(c *Config) { c.Serving.Port = 70000 }, "serving.port: 70000: must be 1-65535"},
		{"no cert dir", func(c *Config) { c.Serving.CertDir = "" }, "serving.certDir: must be set"},
		{"no policy ConfigMap", func(c *Config) { c.Policy.ConfigMap.Name = "" }, "policy.configMap: NAMESPACE/NAME is required without policy.file"},
		{"write dir without a Secret", func(c *Config) { c.Certificates.WriteDir = true }, "certificates.writeDir:"},
		{"backstop standalone", func(c *Config) { c.Policy.File = BuiltinPolicy; c.Backstop.Enabled = true }, "backstop.enabled: needs an API server"},
		{"KAI guard alone", func(c *Config) { c.Backstop.CEL.KAIGuardOnly = true }, "backstop.cel.kaiGuardOnly: "},
		{"owner alone", func(c *Config) { c.Backstop.Owner = "r" }, "backstop.owner: "},
		{"pre-filter without configurations", func(c *Config) { c.Prefilter.Webhooks = []string{"w"} }, "prefilter.webhooks: "},
		{"inject maybe", func(c *Config) { c.Hardening.InjectVoid = "maybe" }, `hardening.injectVoid: "maybe": want always, auto or never`},
		{"auto standalone", func(c *Config) { c.Policy.File = BuiltinPolicy; c.Hardening.InjectVoid = InjectAuto }, "hardening.injectVoid: auto follows the GPU nodes' reports"},
		{"auto without labels", func(c *Config) { c.Hardening.InjectVoid = InjectAuto; c.Hardening.GPUNodeLabels = nil }, "hardening.gpuNodeLabels: "},
		{"lease namespace without auto", func(c *Config) { c.Hardening.EnforcerLeaseNamespace = "gpuguard" }, "hardening.enforcerLeaseNamespace: "},
		{"audit too often", func(c *Config) { c.Audit.Interval = 5 * time.Second }, "audit.interval: 5s: use 0 (off) or at least 10s"},
		{"audit standalone", func(c *Config) { c.Policy.File = BuiltinPolicy; c.Audit.Interval = time.Minute }, "audit.interval: needs an API server"},
		{"reports without audit", func(c *Config) { c.Audit.Reports = true }, "audit.reports: "},
		{"no reviews", func(c *Config) { c.Limits.MaxReviews = 0 }, "limits.maxReviews: 0: want at least 1"},
		{"API reads unbounded", func(c *Config) { c.Lookups.APIReadTimeout = 0 }, "lookups.apiReadTimeout: "},
	} {
		c := base
		c.Hardening.GPUNodeLabels = slices.Clone(base.Hardening.GPUNodeLabels)
		tc.edit(&c)
		err := c.Validate()
		if (tc.wantErr == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.wantErr)
		}
		if err != nil && strings.Contains(err.Error(), "--") {
			t.Errorf("%s: a library error names a flag: %v", tc.name, err)
		}
		for _, fe := range FieldErrors(err) {
			if fe.Field == "" || fe.Detail == "" {
				t.Errorf("%s: %#v", tc.name, fe)
			}
		}
	}
	if RoleServe.applies() || !RoleControl.applies() || !RoleAll.applies() {
		t.Error("only a serving pod leaves the cluster's objects to another")
	}

	// Every error at once, each a FieldError.
	c := base
	c.Serving.Port, c.Limits.MaxReviews, c.Role = 0, 0, "x"
	if got := len(FieldErrors(c.Validate())); got != 3 {
		t.Errorf("three bad settings: %d FieldErrors (%v)", got, c.Validate())
	}
}
