package main

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuguard/gpuguard/testsupport/testcerts"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/policy"
)

// The CLI tests run the built binary, as scripts and CI pipelines do.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "gpuguard-cli")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "gpuguard")
	// Built as make build-gpuguard builds it (static, -trimpath, without
	// debug information), so that the build cache serves both.
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", binary, "./cmd/gpuguard")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		panic("building gpuguard: " + err.Error() + "\n" + string(out))
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type cliResult struct {
	code           int
	stdout, stderr string
}

func gpuguard(t *testing.T, stdin string, args ...string) cliResult {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	r := cliResult{code, out.String(), errOut.String()}
	for _, s := range []string{r.stdout, r.stderr} {
		if strings.Contains(s, "goroutine ") || strings.Contains(s, "panic:") {
			t.Fatalf("gpuguard %v crashed:\n%s", args, s)
		}
	}
	return r
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

const plainPod = `apiVersion: v1
kind: Pod
metadata: {name: plain}
spec:
  containers: [{name: app, image: busybox}]
`

const leakPod = `apiVersion: v1
kind: Pod
metadata: {name: leak, namespace: team-a}
spec:
  containers:
    - name: app
      image: cuda
      env: [{name: NVIDIA_VISIBLE_DEVICES, value: all}]
`

func TestCheckExamplesText(t *testing.T) {
	r := gpuguard(t, "", "check", "examples/")
	if r.code != 1 {
		t.Fatalf("exit %d, want 1 (the examples include denied objects); stderr: %s", r.code, r.stderr)
	}
	for _, want := range []string{
		"ALLOW   Job ml-team/resnet-train",
		"MUTATE  Pod ml-team/notebook",
		"DENY    Pod ml-team/free-gpus",
		"DENY    Deployment ml-team/llm-serving",
		"WARN    Pod ml-team/finetune",
		"spec.containers[0].env[0] (container \"miner\") [device-env]",
		"patch: add /spec/containers/0/env",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, r.stdout)
		}
	}
}

func TestCheckExamplesJSON(t *testing.T) {
	r := gpuguard(t, "", "check", "-o", "json", "examples/")
	if r.code != 1 {
		t.Fatalf("exit %d, want 1; stderr: %s", r.code, r.stderr)
	}
	var results []map[string]json.RawMessage
	if err := json.Unmarshal([]byte(r.stdout), &results); err != nil {
		t.Fatalf("stdout is not one JSON array: %v\n%s", err, r.stdout)
	}
	if len(results) != 11 {
		t.Errorf("%d results, want one per evaluated object (11)", len(results))
	}
	verdicts := map[string]bool{}
	for _, obj := range results {
		for _, key := range []string{"apiVersion", "kind", "namespace", "name", "allowed", "violations", "warnings", "patch"} {
			if v, ok := obj[key]; !ok || string(v) == "null" {
				t.Errorf("%s: %q missing or null", obj["name"], key)
			}
		}
		var allowed bool
		var patch, violations []map[string]any
		json.Unmarshal(obj["allowed"], &allowed)
		json.Unmarshal(obj["patch"], &patch)
		json.Unmarshal(obj["violations"], &violations)
		switch {
		case !allowed:
			verdicts["deny"] = true
			for _, v := range violations {
				for _, key := range []string{"path", "rule", "message"} {
					if v[key] == "" || v[key] == nil {
						t.Errorf("violation lacks %s: %v", key, v)
					}
				}
			}
		case len(patch) > 0:
			verdicts["mutate"] = true
			if patch[0]["op"] != "add" || !strings.HasPrefix(patch[0]["path"].(string), "/spec/") {
				t.Errorf("unexpected patch %v", patch)
			}
		default:
			verdicts["allow"] = true
		}
	}
	if len(verdicts) != 3 {
		t.Errorf("want allowed, mutated and denied objects, got %v", verdicts)
	}
}

func TestCheckExitStatus(t *testing.T) {
	list := `{"apiVersion": "v1", "kind": "List", "items": [` +
		`{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a"}, "spec": {"containers": [{"name": "c", "image": "x"}]}},` +
		`{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}]}`
	for _, tc := range []struct {
		name  string
		stdin string
		args  []string
		code  int
		out   string // in stdout
		err   string // in stderr
	}{
		{"allowed from stdin", plainPod, []string{"check", "-"}, 0, "MUTATE  Pod default/plain (<stdin>#1)", ""},
		{"denied from stdin", leakPod, []string{"check", "-"}, 1, "DENY    Pod team-a/leak", ""},
		{"warn mode allows", leakPod, []string{"check", "--mode", "warn", "-"}, 0, "WARN    Pod team-a/leak", ""},
		{"audit mode allows", leakPod, []string{"check", "--mode", "audit", "-"}, 0, "audit: device-env=", ""},
		{"kind List", list, []string{"check", "-"}, 0, "SKIP    Service s (<stdin>#1.2)", ""},
		{"json list", list, []string{"check", "-o", "json", "-"}, 0, `"source": "<stdin>#1.1"`, "skipped: Service s"},
		{"empty input", "", []string{"check", "-"}, 2, "", "no documents in the input"},
		{"only separators", "---\n---\n", []string{"check", "-"}, 2, "", "no documents in the input"},
		{"broken yaml", plainPod + "---\nkind: [\n", []string{"check", "-"}, 2, "MUTATE  Pod default/plain", "<stdin>:7: document 2: yaml: line 7:"},
		{"not an object", plainPod + "---\n- a\n- b\n", []string{"check", "-"}, 0, "SKIP    <stdin>#2: not a Kubernetes object", ""},
		{"no kind", "metadata: {name: x}\n", []string{"check", "-"}, 0, "SKIP    <stdin>#1: not a Kubernetes object", ""},
		{"kustomization", "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [pod.yaml]\n", []string{"check", "-"}, 0, "SKIP    Kustomization", ""},
		{"bad field type", "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containers: 3}\n", []string{"check", "-"}, 2, "", `<stdin>:1: document 1: Pod "x"`},
		{"unknown field", leakPod + "---\n" + strings.Replace(plainPod, "image:", "imagee:", 1), []string{"check", "-"}, 2, "DENY    Pod team-a/leak",
			`<stdin>:10: document 2: Pod "plain": strict decoding error: unknown field "spec.containers[0].imagee"`},
		{"duplicate field", "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers: []\n  containers: []\n", []string{"check", "-"}, 2, "", `line 6: key "containers" already set in map`},
		{"missing file", "", []string{"check", "does-not-exist.yaml"}, 2, "", "does-not-exist.yaml: no such file"},
		{"no paths", "", []string{"check"}, 2, "", "name the manifests to check"},
		{"policy only", "", []string{"check", "--policy", "config/default.yaml"}, 0, "policy config/default.yaml is valid (mode enforce)", ""},
		{"invalid policy only", "", []string{"check", "--policy", "examples/denied-no-limit-all-gpus.yaml"}, 2, "", "invalid policy"},
		{"bad output", plainPod, []string{"check", "-o", "yaml", "-"}, 2, "", `-o "yaml": use text, json or sarif`},
		{"quiet", plainPod + "---\n" + leakPod + "---\n" + strings.Replace(plainPod, "plain", "other", 1), []string{"check", "-q", "-"}, 1, "3 objects: 0 allowed, 2 mutated", ""},
		{"bad mode", plainPod, []string{"check", "--mode", "strict", "-"}, 2, "", `--mode "strict"`},
		{"unknown flag", "", []string{"check", "--colour", "-"}, 2, "", "unknown flag: --colour"},
		{"cert dir without a Secret", "", []string{"webhook", "--policy-file", "--write-cert-dir"}, 2, "", "--write-cert-dir (certificates.writeDir): writes the certificates of certificates.secret"},
		{"audit too often", "", []string{"webhook", "--policy-file", "--audit-interval", "5s"}, 2, "", "--audit-interval (audit.interval): 5s: use 0 (off) or at least 10s"},
		{"audit without an API server", "", []string{"webhook", "--policy-file", "--audit-interval", "1m"}, 2, "", "--audit-interval (audit.interval): needs an API server"},
		{"reports without audit", "", []string{"webhook", "--policy-file", "--audit-reports"}, 2, "", "--audit-reports (audit.reports): writes the background audit's results; set audit.interval"},
		{"every bad setting at once", "", []string{"webhook", "--policy-file", "--audit-reports", "--write-cert-dir"}, 2, "", "--write-cert-dir (certificates.writeDir)"},
		{"inject-void maybe", "", []string{"webhook", "--policy-file", "--inject-void=maybe"}, 2, "", `invalid argument "maybe" for "--inject-void" flag: want one of always, auto, never`},
		{"role unknown", "", []string{"webhook", "--role=writer"}, 2, "", `invalid argument "writer" for "--role" flag: want one of all, serve, control`},
		{"port 0", "", []string{"webhook", "--policy-file", "--port=0"}, 2, "", `invalid argument "0" for "--port" flag: want a port, 1-65535`},
		{"duration", "", []string{"webhook", "--policy-file", "--shutdown-delay=-1s"}, 2, "", `invalid argument "-1s" for "--shutdown-delay" flag: must not be negative`},
		{"namespaced name", "", []string{"webhook", "--policy-configmap=gpuguard"}, 2, "", `invalid argument "gpuguard" for "--policy-configmap" flag: want NAMESPACE/NAME`},
		{"node label", "", []string{"webhook", "--gpu-node-label=nvidia.com/gpu.present"}, 2, "", `invalid argument "nvidia.com/gpu.present" for "--gpu-node-label" flag: node label "nvidia.com/gpu.present": want KEY=VALUE`},
		{"no reviews", "", []string{"webhook", "--policy-file", "--max-inflight-reviews=0"}, 2, "", `invalid argument "0" for "--max-inflight-reviews" flag: want an integer of at least 1`},
		{"audit without namespaces", "", []string{"audit"}, 2, "", "-A for all, or -n NAMESPACE"},
		{"version", "", []string{"version"}, 0, "gpuguard ", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := gpuguard(t, tc.stdin, tc.args...)
			if r.code != tc.code {
				t.Errorf("exit %d, want %d\nstdout: %s\nstderr: %s", r.code, tc.code, r.stdout, r.stderr)
			}
			if !strings.Contains(r.stdout, tc.out) {
				t.Errorf("stdout lacks %q:\n%s", tc.out, r.stdout)
			}
			if !strings.Contains(r.stderr, tc.err) {
				t.Errorf("stderr lacks %q:\n%s", tc.err, r.stderr)
			}
		})
	}
}

func TestCheckPolicyFlag(t *testing.T) {
	stripPolicy := writeFile(t, "policy.yaml", "apiVersion: gpuguard.io/v1alpha1\nkind: GPUGuardPolicy\nspec:\n  action: strip\n")
	r := gpuguard(t, leakPod, "check", "--policy", stripPolicy, "-")
	if r.code != 0 || !strings.Contains(r.stdout, "patch: remove /spec/containers/0/env/0") {
		t.Errorf("strip policy: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	cm := writeFile(t, "cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: gpuguard-policy}\ndata:\n  policy.yaml: |\n"+
		"    apiVersion: gpuguard.io/v1alpha1\n    kind: GPUGuardPolicy\n    spec:\n      mode: warn\n")
	if r := gpuguard(t, leakPod, "check", "--policy", cm, "-"); r.code != 0 || !strings.Contains(r.stdout, "WARN") {
		t.Errorf("ConfigMap policy in warn mode: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	bad := writeFile(t, "bad.yaml", "apiVersion: gpuguard.io/v1alpha1\nkind: GPUGuardPolicy\nspec:\n  injectVoid: true\n  mdoe: warn\n")
	r = gpuguard(t, plainPod, "check", "--policy", bad, "-")
	if r.code != 2 || !strings.Contains(r.stderr, "bad.yaml:5: spec.mdoe: unknown field") {
		t.Errorf("unknown policy field: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := gpuguard(t, plainPod, "check", "--policy", "nope.yaml", "-"); r.code != 2 || !strings.Contains(r.stderr, "nope.yaml") {
		t.Errorf("missing policy file: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestPolicyValuesPreviewIsWhatCheckJudges: the binary carries the chart:
// the policy that policy --values prints is the one check --values judges
// with, and the values file may come on standard input.
func TestPolicyValuesPreviewIsWhatCheckJudges(t *testing.T) {
	values := "policy:\n  presets:\n    gpuOperator:\n      enabled: true\n  spec:\n    exemptions:\n      namespaces: [team-a]\n"
	preview := gpuguard(t, values, "policy", "--values", "-")
	if preview.code != 0 || !strings.Contains(preview.stdout, "- team-a") || !strings.Contains(preview.stdout, "namespace: gpu-operator") {
		t.Fatalf("policy --values -: exit %d\n%s%s", preview.code, preview.stdout, preview.stderr)
	}
	pods := writeFile(t, "pods.yaml", leakPod)
	byPreview := gpuguard(t, "", "check", "-o", "json", "--policy", writeFile(t, "policy.yaml", preview.stdout), pods)
	byValues := gpuguard(t, "", "check", "-o", "json", "--values", writeFile(t, "values.yaml", values), pods)
	if byValues.code != 0 || byValues.stdout != byPreview.stdout || byValues.code != byPreview.code {
		t.Errorf("check --values (exit %d) and check --policy with its preview (exit %d) differ, or deny team-a's pod:\n%s\n%s%s",
			byValues.code, byPreview.code, byValues.stdout, byPreview.stdout, byValues.stderr)
	}
}

func TestCheckInputsServeInspection(t *testing.T) {
	in := `apiVersion: v1
kind: Namespace
metadata: {name: lab, labels: {gpuguard.io/mode: enforce}}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: env, namespace: lab}
data: {NVIDIA_VISIBLE_DEVICES: all}
---
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: lab}
spec:
  containers:
    - name: train
      image: pytorch
      envFrom: [{configMapRef: {name: env}}]
      resources: {limits: {nvidia.com/gpu: 1}}
`
	r := gpuguard(t, in, "check", "--mode", "audit", "-")
	if r.code != 1 || !strings.Contains(r.stdout, "[envfrom-unprefixed]") {
		t.Errorf("the ConfigMap in the input must be inspected and the Namespace label tighten audit to enforce: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

func TestCheckDirectoryWithoutManifests(t *testing.T) {
	dir := t.TempDir()
	if r := gpuguard(t, "", "check", dir); r.code != 2 || !strings.Contains(r.stderr, "no *.yaml") {
		t.Errorf("exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestRenderCEL(t *testing.T) {
	r := gpuguard(t, "", "render-cel", "--exclude-namespace", "gpuguard")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	for _, want := range []string{"# Enforced by the webhook only:", "# Runtime CEL cost, as the API server counts it", "#   ValidatingAdmissionPolicy, message expressions: ", "kind: ValidatingAdmissionPolicy\n", "kind: ValidatingAdmissionPolicyBinding",
		"kind: MutatingAdmissionPolicy\n", "kind: MutatingAdmissionPolicyBinding", "- gpuguard\n"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("render-cel output lacks %q", want)
		}
	}
	bad := writeFile(t, "bad.yaml", "apiVersion: gpuguard.io/v1alpha1\nkind: GPUGuardPolicy\nspec:\n  gpuResources: ['nvidia.com/[ab]']\n")
	if r := gpuguard(t, "", "render-cel", "--policy", bad); r.code != 2 || !strings.Contains(r.stderr, "bad.yaml:4: spec.gpuResources[0]") {
		t.Errorf("a bad policy: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestWebhookStandalone runs `gpuguard webhook --policy-file` as a process with real
// certificates and posts a review over TLS.
// standaloneWebhook is the gpuguard binary serving the built-in policy.
type standaloneWebhook struct {
	port   int
	client *http.Client
	logs   *syncBuffer
}

// syncBuffer is a bytes.Buffer the process writes to while the test reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startStandaloneWebhook runs `gpuguard webhook --policy-file` with env added
// until it is ready; at cleanup it sends SIGTERM and expects a clean exit.
func startStandaloneWebhook(t *testing.T, env ...string) *standaloneWebhook {
	t.Helper()
	dir := t.TempDir()
	ca, err := testcerts.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.WriteServing(dir); err != nil {
		t.Fatal(err)
	}
	port, probe := freePort(t), freePort(t)
	cmd := exec.Command(binary, "webhook", "--policy-file", "--cert-dir", dir, "--host", "127.0.0.1", "--metrics-bind-address", "0",
		"--port", strconv.Itoa(port), "--health-probe-bind-address", "127.0.0.1:"+strconv.Itoa(probe))
	cmd.Env = append(os.Environ(), env...)
	w := &standaloneWebhook{port: port, logs: &syncBuffer{},
		client: &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}}
	cmd.Stdout, cmd.Stderr = w.logs, w.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("the webhook did not exit cleanly on SIGTERM: %v", err)
			}
		case <-time.After(90 * time.Second):
			t.Error("the webhook did not exit on SIGTERM")
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", probe))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return w
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready within 30s:\n%s", w.logs.String())
		}
		time.Sleep(20 * time.Millisecond) // polling interval of the readiness wait
	}
}

type reviewAnswer struct {
	Response struct {
		UID     string `json:"uid"`
		Allowed bool   `json:"allowed"`
		Patch   []byte `json:"patch"`
	} `json:"response"`
}

// mutate posts a review of podJSON as uid to /mutate.
func (w *standaloneWebhook) mutate(uid string) (reviewAnswer, error) {
	review := `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"` + uid + `",
"kind":{"group":"","version":"v1","kind":"Pod"},"resource":{"group":"","version":"v1","resource":"pods"},
"namespace":"team-a","operation":"CREATE","userInfo":{"username":"alice"},"object":` + podJSON + `}}`
	var out reviewAnswer
	resp, err := w.client.Post(fmt.Sprintf("https://localhost:%d/mutate", w.port), "application/json", strings.NewReader(review))
	if err != nil {
		return out, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return out, fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return out, json.NewDecoder(resp.Body).Decode(&out)
}

func TestWebhookStandalone(t *testing.T) {
	w := startStandaloneWebhook(t, "GPUGUARD_MEMORY_LIMIT=268435456")
	out, err := w.mutate("u1")
	if err != nil {
		t.Fatal(err)
	}
	if out.Response.UID != "u1" || !out.Response.Allowed || !strings.Contains(string(out.Response.Patch), `"value":"void"`) {
		t.Errorf("want the void injection, got %+v (patch %s)", out.Response, out.Response.Patch)
	}
	if !strings.Contains(w.logs.String(), `"goMemoryLimit":241591905`) {
		t.Errorf("the Go memory limit was not set to 90%% of GPUGUARD_MEMORY_LIMIT:\n%s", w.logs.String())
	}
}

// TestEveryDecisionIsLogged: decision lines are an audit trail, so none is
// sampled away, however many arrive in a second (zap's production sampling
// would keep about 100 a second of one message); each names the user.
func TestEveryDecisionIsLogged(t *testing.T) {
	w := startStandaloneWebhook(t)
	const reviews, clients = 600, 8
	var g errgroup.Group
	for c := range clients {
		g.Go(func() error {
			for i := c; i < reviews; i += clients {
				if _, err := w.mutate(fmt.Sprintf("u%d", i)); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	// The process's output reaches the test through a pipe, a moment after
	// the answers: wait for it.
	lines := 0
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) { // polling interval
		if lines = decisionLines(w.logs.String()); lines >= reviews {
			break
		}
	}
	if lines != reviews {
		t.Errorf("%d decision lines naming the user for %d decisions", lines, reviews)
	}
}

func decisionLines(logs string) int {
	n := 0
	for line := range strings.SplitSeq(logs, "\n") {
		if strings.Contains(line, `"msg":"admission mutate"`) && strings.Contains(line, `"user":"alice"`) {
			n++
		}
	}
	return n
}

const podJSON = `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"team-a"},"spec":{"containers":[{"name":"app","image":"busybox"}]}}`

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func TestVerifyUsage(t *testing.T) {
	notYAML := writeFile(t, "broken.kubeconfig", "clusters: [\n")
	noCluster := writeFile(t, "empty.kubeconfig", "apiVersion: v1\nkind: Config\n")
	missing := filepath.Join(t.TempDir(), "missing.kubeconfig")
	for _, tc := range []struct {
		name string
		args []string
		err  string // in stderr
	}{
		{"bad expect", []string{"verify", "-n", "team-a", "--expect", "block"}, `--expect "block": use deny, warn, admit`},
		{"no namespace", []string{"verify", "--kubeconfig", noCluster}, `required flag(s) "namespace" not set`},
		{"missing kubeconfig", []string{"verify", "-n", "team-a", "--kubeconfig", missing}, "--kubeconfig " + missing + ": stat"},
		{"kubeconfig not YAML", []string{"verify", "-n", "team-a", "--kubeconfig", notYAML}, "broken.kubeconfig"},
		{"kubeconfig without a cluster", []string{"verify", "-n", "team-a", "--kubeconfig", noCluster}, "empty.kubeconfig: no cluster configured in it"},
		{"empty namespace", []string{"verify", "-n", "", "--kubeconfig", noCluster}, "--namespace: name a namespace"},
		{"zero timeout", []string{"verify", "-n", "team-a", "--kubeconfig", noCluster, "--timeout", "0s"}, "--timeout 0s: must be above zero"},
		{"negative wait", []string{"verify", "-n", "team-a", "--kubeconfig", noCluster, "--wait", "-1s"}, "--wait -1s: must be zero"},
		{"argument", []string{"verify", "-n", "team-a", "extra"}, `unknown command "extra"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := gpuguard(t, "", tc.args...)
			if r.code != 2 || !strings.Contains(r.stderr, tc.err) || r.stdout != "" {
				t.Errorf("exit %d, want 2 with %q on stderr\nstdout: %s\nstderr: %s", r.code, tc.err, r.stdout, r.stderr)
			}
		})
	}
}

// apiAnswer is what the fake API server below says to the dry-run create.
type apiAnswer struct {
	code    int
	reason  string // of a Status
	message string
	warning string // a Warning header
	// stripped: the created pod comes back with NVIDIA_VISIBLE_DEVICES=void,
	// as gpuguard's strip action leaves it.
	stripped bool
}

// fakeAPIServer answers pod creations in namespace team-a with a, and records
// whether the request was the dry run verify must send.
func fakeAPIServer(t *testing.T, a apiAnswer) (kubeconfig string, dryRun *atomic.Bool) {
	t.Helper()
	return fakeAPIServerAnswering(t, func(int) apiAnswer { return a })
}

// fakeAPIServerAnswering answers the nth pod creation (from 1) with
// answerTo(n).
func fakeAPIServerAnswering(t *testing.T, answerTo func(n int) apiAnswer) (kubeconfig string, dryRun *atomic.Bool) {
	t.Helper()
	dryRun = &atomic.Bool{}
	var creates atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		if req.Method != http.MethodPost || req.URL.Path != "/api/v1/namespaces/team-a/pods" {
			http.NotFound(w, req)
			return
		}
		a := answerTo(int(creates.Add(1)))
		// The body may be JSON or protobuf; both hold the name as is.
		dryRun.Store(req.URL.Query().Get("dryRun") == "All" && strings.Contains(string(body), "NVIDIA_VISIBLE_DEVICES"))
		if a.warning != "" {
			w.Header().Set("Warning", "299 - "+strconv.Quote(a.warning))
		}
		if a.code == http.StatusCreated {
			if a.stripped {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(a.code)
				json.NewEncoder(w).Encode(strippedPod())
				return
			}
			w.Header().Set("Content-Type", req.Header.Get("Content-Type"))
			w.WriteHeader(a.code)
			w.Write(body)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(a.code)
		json.NewEncoder(w).Encode(map[string]any{"apiVersion": "v1", "kind": "Status", "status": "Failure",
			"code": a.code, "reason": a.reason, "message": a.message})
	}))
	t.Cleanup(srv.Close)
	kubeconfig = writeFile(t, "kubeconfig", fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: fake, cluster: {server: %q}}]
users: [{name: admin, user: {token: t}}]
contexts: [{name: fake, context: {cluster: fake, user: admin}}]
current-context: fake
`, srv.URL))
	return kubeconfig, dryRun
}

// strippedPod is verify's pod as gpuguard's strip action admits it.
func strippedPod() *corev1.Pod {
	return &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "gpuguard-verify-x", Namespace: "team-a"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "miner", Image: "busybox",
			Env: []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "void"}}}}},
	}
}

func TestVerifyJudgesTheAnswer(t *testing.T) {
	webhookDenial := apiAnswer{403, "Forbidden", `admission webhook "validate.pods.gpuguard.io" denied the request: gpuguard denied this pod (mode enforce)` +
		"\n- spec.containers[0].env[0] (container \"miner\") [device-env]: sets NVIDIA_VISIBLE_DEVICES=\"all\" without a GPU limit", "", false}
	backstopDenial := apiAnswer{422, "Invalid", `pods "gpuguard-verify-x" is forbidden: ValidatingAdmissionPolicy 'gpuguard-backstop' with binding 'gpuguard-backstop' denied request: gpuguard backstop [device-env]: a container sets NVIDIA_VISIBLE_DEVICES`, "", false}
	otherDenial := apiAnswer{403, "Forbidden", `pods "gpuguard-verify-x" is forbidden: violates PodSecurity "restricted:latest"`, "", false}
	webhookDown := apiAnswer{500, "InternalError", `Internal error occurred: failed calling webhook "validate.pods.gpuguard.io": connection refused`, "", false}
	warned := apiAnswer{201, "", "", `gpuguard device-env: spec.containers[0].env[0]: sets NVIDIA_VISIBLE_DEVICES="all" without a GPU limit`, false}
	created := apiAnswer{201, "", "", "", false}
	stripped := apiAnswer{201, "", "", `gpuguard device-env: stripped NVIDIA_VISIBLE_DEVICES`, true}
	for _, tc := range []struct {
		name   string
		expect string
		answer apiAnswer
		code   int
		out    []string // in stdout
	}{
		{"webhook denial", "deny", webhookDenial, 0, []string{"HTTP 403 Forbidden: admission webhook", "[device-env]", "PASS: gpuguard denied"}},
		{"backstop denial", "deny", backstopDenial, 0, []string{"HTTP 422 Invalid", "PASS: gpuguard denied"}},
		{"someone else's denial", "deny", otherDenial, 1, []string{"FAIL: expected gpuguard to deny", `got 403 Forbidden: pods "gpuguard-verify-x" is forbidden: violates PodSecurity`}},
		{"webhook unreachable", "deny", webhookDown, 1, []string{"FAIL: expected gpuguard to deny", "got 500 InternalError: Internal error occurred: failed calling webhook"}},
		{"created instead of denied", "deny", warned, 1, []string{"FAIL: expected gpuguard to deny", "got 201 Created (dry run) still with NVIDIA_VISIBLE_DEVICES=all, with warnings: gpuguard device-env"}},
		{"warning", "warn", warned, 0, []string{"HTTP 201 Created", "Warning: gpuguard device-env", "PASS: gpuguard warned"}},
		{"no warning", "warn", created, 1, []string{"FAIL: expected gpuguard to warn", "got 201 Created (dry run) still with NVIDIA_VISIBLE_DEVICES=all, with no warnings"}},
		{"admitted unchanged", "admit", created, 0, []string{"PASS: the violating pod was admitted unchanged", "audit log"}},
		{"admitted and mutated", "admit", stripped, 0, []string{"PASS: the violating pod was admitted in namespace team-a (mode audit), with NVIDIA_VISIBLE_DEVICES made harmless"}},
		{"denied instead of admitted", "admit", webhookDenial, 1, []string{"FAIL: expected gpuguard to admit", "got 403 Forbidden: admission webhook"}},
		{"stripped", "strip", stripped, 0, []string{"HTTP 201 Created", "PASS: gpuguard stripped"}},
		{"admitted unchanged instead of stripped", "strip", warned, 1, []string{"FAIL: expected gpuguard to strip", "still with NVIDIA_VISIBLE_DEVICES=all"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kubeconfig, dryRun := fakeAPIServer(t, tc.answer)
			r := gpuguard(t, "", "verify", "--kubeconfig", kubeconfig, "--namespace", "team-a", "--expect", tc.expect)
			if r.code != tc.code {
				t.Errorf("exit %d, want %d\nstdout: %s\nstderr: %s", r.code, tc.code, r.stdout, r.stderr)
			}
			for _, want := range tc.out {
				if !strings.Contains(r.stdout, want) {
					t.Errorf("stdout lacks %q:\n%s", want, r.stdout)
				}
			}
			if !dryRun.Load() {
				t.Error("verify must send a dry-run (dryRun=All) create of a pod with NVIDIA_VISIBLE_DEVICES=all")
			}
		})
	}
}

// TestVerifyWaitsForThePolicy: after a switch to enforce, the webhook
// applies the policy within seconds; --wait asks again until the denial
// comes, and without it the first answer stands.
func TestVerifyWaitsForThePolicy(t *testing.T) {
	warned := apiAnswer{201, "", "", `gpuguard device-env: spec.containers[0].env[0]: sets NVIDIA_VISIBLE_DEVICES="all" without a GPU limit`, false}
	denied := apiAnswer{403, "Forbidden", `admission webhook "validate.pods.gpuguard.io" denied the request: gpuguard denied this pod (mode enforce)`, "", false}
	switchesOnThird := func(n int) apiAnswer {
		if n < 3 {
			return warned
		}
		return denied
	}
	kubeconfig, _ := fakeAPIServerAnswering(t, switchesOnThird)
	if r := gpuguard(t, "", "verify", "--kubeconfig", kubeconfig, "-n", "team-a"); r.code != 1 {
		t.Errorf("without --wait: exit %d, want 1 on the first answer\nstdout: %s", r.code, r.stdout)
	}
	kubeconfig, _ = fakeAPIServerAnswering(t, switchesOnThird)
	r := gpuguard(t, "", "verify", "--kubeconfig", kubeconfig, "-n", "team-a", "--wait", "30s")
	if r.code != 0 || !strings.Contains(r.stdout, "PASS: gpuguard denied") || strings.Contains(r.stdout, "Warning:") {
		t.Errorf("with --wait: exit %d, want 0 with the denial alone printed\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	kubeconfig, _ = fakeAPIServerAnswering(t, func(int) apiAnswer { return warned })
	if r := gpuguard(t, "", "verify", "--kubeconfig", kubeconfig, "-n", "team-a", "--wait", "2s"); r.code != 1 || !strings.Contains(r.stdout, "FAIL") {
		t.Errorf("a policy never in force: exit %d, want 1 after the wait\nstdout: %s", r.code, r.stdout)
	}
}

func TestVerifyWithoutAnAnswer(t *testing.T) {
	kubeconfig := writeFile(t, "kubeconfig", fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: gone, cluster: {server: "http://127.0.0.1:%d"}}]
contexts: [{name: gone, context: {cluster: gone}}]
current-context: gone
`, freePort(t)))
	r := gpuguard(t, "", "verify", "--kubeconfig", kubeconfig, "-n", "team-a")
	if r.code != 1 || !strings.Contains(r.stdout, "FAIL: expected gpuguard to deny the violating pod in namespace team-a; could not reach the API server at http://127.0.0.1:") {
		t.Errorf("exit %d, want 1 with a FAIL line naming the unreachable server\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
}

// TestCheckInARepository: a repository holds YAML that is no Kubernetes
// object (a CI workflow) beside kustomizations. check skips the former with
// a note, and judges each kustomization as kustomize builds it: an overlay
// whose patch sets NVIDIA_VISIBLE_DEVICES=all on a clean base is denied,
// and the patch is never judged on its own (a strategic-merge patch once
// passed as a whole, harmless-looking Pod). A Helm chart is refused with
// how to render it.
func TestCheckInARepository(t *testing.T) {
	dir := t.TempDir()
	write := func(files map[string]string) {
		for name, content := range files {
			path := filepath.Join(dir, name)
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(map[string]string{
		".github/workflows/ci.yaml":              "name: ci\non: push\njobs:\n  test: {runs-on: ubuntu-latest}\n",
		"deploy/base/kustomization.yaml":         "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [pods.yaml]\n",
		"deploy/base/pods.yaml":                  plainPod,
		"deploy/overlays/gpu/kustomization.yaml": "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: team-a\nresources: [../../base]\npatches: [{path: patch.yaml}]\n",
		"deploy/overlays/gpu/patch.yaml": "apiVersion: v1\nkind: Pod\nmetadata: {name: plain}\nspec:\n  containers:\n    - name: app\n" +
			"      env: [{name: NVIDIA_VISIBLE_DEVICES, value: all}]\n",
	})
	r := gpuguard(t, "", "check", dir)
	if r.code != 1 {
		t.Fatalf("exit %d, want 1 (the overlay's pod is denied)\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{"MUTATE  Pod default/plain (" + filepath.Join(dir, "deploy/base") + " (kustomize build)#1)",
		"DENY    Pod team-a/plain (" + filepath.Join(dir, "deploy/overlays/gpu") + " (kustomize build)#1)",
		"ci.yaml#1: not a Kubernetes object", "2 objects: 0 allowed, 1 mutated, 0 warned, 1 denied; 1 skipped"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, r.stdout)
		}
	}
	if strings.Contains(r.stdout, "patch.yaml") {
		t.Errorf("the overlay's patch was judged on its own:\n%s", r.stdout)
	}
	quiet := gpuguard(t, "", "check", "-q", dir)
	if strings.Contains(quiet.stdout, "SKIP") || !strings.Contains(quiet.stdout, "DENY    Pod team-a/plain") {
		t.Errorf("quiet output:\n%s", quiet.stdout)
	}
	write(map[string]string{"charts/app/Chart.yaml": "apiVersion: v2\nname: app\nversion: 0.1.0\n",
		"charts/app/templates/pod.yaml": "{{ .Values.broken }"})
	chart := gpuguard(t, "", "check", dir)
	if chart.code != 2 || !strings.Contains(chart.stderr, "is a Helm chart") || !strings.Contains(chart.stderr, "helm template") ||
		!strings.Contains(chart.stdout, "DENY    Pod team-a/plain") {
		t.Errorf("with a chart in the tree: exit %d, want 2 naming the chart and helm template, the rest still judged\nstdout: %s\nstderr: %s", chart.code, chart.stdout, chart.stderr)
	}
}

// TestCheckSARIF: -o sarif gives one result per finding, with the rule, the
// level and the line of the offending field in its file.
func TestCheckSARIF(t *testing.T) {
	path := writeFile(t, "pods.yaml", plainPod+"---\n"+leakPod)
	r := gpuguard(t, "", "check", "-o", "sarif", path)
	if r.code != 1 {
		t.Fatalf("exit %d, want 1\n%s", r.code, r.stderr)
	}
	log := readSARIF(t, r.stdout)
	if log.Version != "2.1.0" || len(log.Runs) != 1 || len(log.Runs[0].Tool.Driver.Rules) < 10 {
		t.Fatalf("not a SARIF 2.1.0 log with gpuguard's rules:\n%s", r.stdout)
	}
	results := log.Runs[0].Results
	if len(results) != 1 || results[0].RuleID != "device-env" || results[0].Level != "error" || len(results[0].Locations) != 1 {
		t.Fatalf("want one device-env error with a location, got %+v", results)
	}
	// plainPod is 5 lines, "---" the 6th; leakPod's env entry is its 8th line.
	if loc := results[0].Locations[0].Physical; loc.Artifact.URI != path || loc.Region.StartLine != 6+8 {
		t.Errorf("location %+v, want %s line 14", loc, path)
	}
}

// TestCheckSaysWhichContainersSeeNoGPU: for a DCGM exporter's DaemonSet,
// admitted with a warning, check names the container its pods will give
// void, and warns that it will see no GPU.
func TestCheckSaysWhichContainersSeeNoGPU(t *testing.T) {
	in := `apiVersion: apps/v1
kind: DaemonSet
metadata: {name: dcgm-exporter, namespace: dcgm-exporter}
spec:
  selector: {matchLabels: {app: dcgm}}
  template:
    metadata: {labels: {app: dcgm}}
    spec:
      containers:
        - name: dcgm-exporter
          image: nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3-4.1.3-ubuntu22.04
          securityContext: {capabilities: {add: [SYS_ADMIN]}}
`
	// The policy of a cluster that lets DCGM add SYS_ADMIN (the default
	// denies it outside the dcgmExporter preset's service accounts).
	policyFile := filepath.Join(t.TempDir(), "policy.yaml")
	policy := "apiVersion: gpuguard.io/v1alpha1\nkind: GPUGuardPolicy\nmetadata: {name: dcgm}\nspec:\n  allowedCapabilities: [SYS_ADMIN]\n"
	if err := os.WriteFile(policyFile, []byte(policy), 0o600); err != nil {
		t.Fatal(err)
	}
	r := gpuguard(t, in, "check", "--policy", policyFile, "-")
	for _, want := range []string{"WARN    DaemonSet dcgm-exporter/dcgm-exporter",
		"[void-hides-gpu]: will see no GPU", "its pods get NVIDIA_VISIBLE_DEVICES=void in: dcgm-exporter"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("check output lacks %q (exit %d):\n%s%s", want, r.code, r.stdout, r.stderr)
		}
	}
}

// TestCheckJudgesPodTemplatesInCustomResources: the ML job kinds that GPU
// workloads live in (a PyTorchJob, a JobSet, a RayJob) are judged through
// the pod templates inside them, so NVIDIA_VISIBLE_DEVICES=all in any of
// them exits 1; a custom resource without a template is skipped.
func TestCheckJudgesPodTemplatesInCustomResources(t *testing.T) {
	in := `apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: mnist, namespace: team-a}
spec:
  pytorchReplicaSpecs:
    Worker:
      replicas: 2
      template:
        spec:
          containers:
            - {name: pytorch, image: pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime, env: [{name: NVIDIA_VISIBLE_DEVICES, value: all}]}
---
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata: {name: pretrain, namespace: team-a}
spec:
  replicatedJobs:
    - name: workers
      template:
        spec:
          template:
            spec:
              restartPolicy: Never
              containers:
                - {name: train, image: busybox, env: [{name: NVIDIA_VISIBLE_DEVICES, value: all}]}
---
apiVersion: ray.io/v1
kind: RayJob
metadata: {name: tune, namespace: team-a}
spec:
  entrypoint: python tune.py
  rayClusterSpec:
    headGroupSpec:
      rayStartParams: {}
      template:
        spec:
          containers:
            - {name: ray-head, image: rayproject/ray:2.41.0}
    workerGroupSpecs:
      - groupName: gpu
        rayStartParams: {}
        template:
          spec:
            containers:
              - {name: ray-worker, image: rayproject/ray:2.41.0-gpu, env: [{name: NVIDIA_VISIBLE_DEVICES, value: all}]}
---
apiVersion: example.com/v1
kind: Widget
metadata: {name: w}
spec: {size: 3}
`
	r := gpuguard(t, in, "check", "-")
	if r.code != 1 {
		t.Errorf("exit %d, want 1 (denied)", r.code)
	}
	for _, want := range []string{
		"DENY    PyTorchJob team-a/mnist.spec.pytorchReplicaSpecs.Worker.template",
		"DENY    JobSet team-a/pretrain.spec.replicatedJobs[0].template.spec.template",
		"ALLOW   RayJob team-a/tune.spec.rayClusterSpec.headGroupSpec.template",
		"DENY    RayJob team-a/tune.spec.rayClusterSpec.workerGroupSpecs[0].template",
		"SKIP    Widget w", "[device-env]",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("check output lacks %q (exit %d):\n%s%s", want, r.code, r.stdout, r.stderr)
		}
	}
}

// TestCLIFirstHour: what a platform team reaches for first. --version
// answers, the built-in policy prints and parses, the rules list every
// registered rule, -n judges namespaceless manifests where they will be
// created (so a namespace exemption applies), and --fail-on warn fails a
// run whose objects are only warned about.
func TestCLIFirstHour(t *testing.T) {
	if r := gpuguard(t, "", "--version"); r.code != 0 || !strings.HasPrefix(r.stdout, "gpuguard ") {
		t.Errorf("--version: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	r := gpuguard(t, "", "policy")
	if _, err := config.Parse("built-in", []byte(r.stdout)); r.code != 0 || err != nil {
		t.Errorf("policy: exit %d, does not parse: %v", r.code, err)
	}
	r = gpuguard(t, "", "rules")
	for _, rule := range policy.Registry() {
		if !strings.Contains(r.stdout, string(rule.ID)) {
			t.Errorf("rules lacks %s:\n%s", rule.ID, r.stdout)
		}
	}
	leak := "apiVersion: v1\nkind: Pod\nmetadata: {name: leak}\nspec:\n  containers:\n    - {name: c, image: busybox, env: [{name: NVIDIA_VISIBLE_DEVICES, value: all}]}\n"
	exempting := "apiVersion: gpuguard.io/v1alpha1\nkind: GPUGuardPolicy\nspec:\n  exemptions: {namespaces: [gpu-infra]}\n"
	dir := t.TempDir()
	policyFile := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policyFile, []byte(exempting), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := gpuguard(t, leak, "check", "--policy", policyFile, "-"); r.code != 1 {
		t.Errorf("in default: exit %d, want 1 (denied)", r.code)
	}
	if r := gpuguard(t, leak, "check", "--policy", policyFile, "-n", "gpu-infra", "-"); r.code != 0 || !strings.Contains(r.stdout, "gpu-infra/leak") {
		t.Errorf("-n gpu-infra: exit %d, want 0 (exempt):\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := gpuguard(t, leak, "check", "-n", "Not_A_Namespace", "-"); r.code != 2 || !strings.Contains(r.stderr, "--namespace") {
		t.Errorf("a bad -n: exit %d, %q; want 2 naming --namespace", r.code, r.stderr)
	}
	// An annotation of an injector the policy does not list: a warning.
	warned := "apiVersion: v1\nkind: Pod\nmetadata: {name: inject, namespace: team-a, annotations: {mounts.example.com/extra: x}}\nspec:\n  containers:\n    - {name: c, image: busybox}\n"
	if r := gpuguard(t, warned, "check", "-"); r.code != 0 {
		t.Errorf("a warning alone: exit %d, want 0", r.code)
	}
	if r := gpuguard(t, warned, "check", "--fail-on", "warn", "-"); r.code != 1 {
		t.Errorf("--fail-on warn: exit %d, want 1", r.code)
	}
	if r := gpuguard(t, warned, "check", "--fail-on", "never", "-"); r.code != 2 || !strings.Contains(r.stderr, "--fail-on") {
		t.Errorf("--fail-on never: exit %d, %q; want 2 naming --fail-on", r.code, r.stderr)
	}
}

// TestCheckInputErrorsInTheOutput: an input that cannot be judged is in
// JSON and SARIF, not only on standard error: JSON carries an entry with
// its source, line and problem; SARIF marks the run unsuccessful with a
// located notification, so a failed run never uploads as a clean scan.
// Results read from standard input are located too ("stdin"), as code
// scanning requires.
func TestCheckInputErrorsInTheOutput(t *testing.T) {
	in := leakPod + "---\nnot: [valid\n"
	r := gpuguard(t, in, "check", "-o", "json", "-")
	if r.code != 2 {
		t.Fatalf("exit %d, want 2 (an input could not be judged)\n%s", r.code, r.stderr)
	}
	var entries []struct {
		Source, Error string
		Line          int
		Allowed       bool
	}
	if err := json.Unmarshal([]byte(r.stdout), &entries); err != nil {
		t.Fatalf("%v\n%s", err, r.stdout)
	}
	if len(entries) != 2 || entries[1].Error == "" || entries[1].Source != "<stdin>" || entries[1].Line != strings.Count(leakPod, "\n")+2 || entries[1].Allowed {
		t.Fatalf("want the leak, then an error entry for stdin at its line, got %+v", entries)
	}
	r = gpuguard(t, in, "check", "-o", "sarif", "-")
	log := readSARIF(t, r.stdout)
	run := log.Runs[0]
	if len(run.Invocations) != 1 || run.Invocations[0].ExecutionSuccessful || len(run.Invocations[0].Notifications) != 1 ||
		run.Invocations[0].Notifications[0].Level != "error" || len(run.Invocations[0].Notifications[0].Locations) != 1 {
		t.Errorf("want an unsuccessful invocation with one located error, got %+v", run.Invocations)
	}
	if len(run.Results) != 1 || len(run.Results[0].Locations) != 1 || run.Results[0].Locations[0].Physical.Artifact.URI != "stdin" {
		t.Errorf("want the leak's result located in stdin, got %+v", run.Results)
	}
	clean := gpuguard(t, plainPod, "check", "-o", "sarif", "-")
	if !strings.Contains(clean.stdout, `"executionSuccessful": true`) {
		t.Errorf("a run that judged everything must say so:\n%s", clean.stdout)
	}
}

// sarifOutput is what the tests read of check's SARIF.
type sarifOutput struct {
	Version string `json:"version"`
	Runs    []struct {
		Tool struct {
			Driver struct {
				Rules []struct{ ID string } `json:"rules"`
			} `json:"driver"`
		} `json:"tool"`
		Invocations []struct {
			ExecutionSuccessful bool `json:"executionSuccessful"`
			Notifications       []struct {
				Level     string          `json:"level"`
				Locations []sarifLocation `json:"locations"`
			} `json:"toolExecutionNotifications"`
		} `json:"invocations"`
		Results []struct {
			RuleID    string          `json:"ruleId"`
			Level     string          `json:"level"`
			Locations []sarifLocation `json:"locations"`
		} `json:"results"`
	} `json:"runs"`
}

type sarifLocation struct {
	Physical struct {
		Artifact struct{ URI string } `json:"artifactLocation"`
		Region   struct {
			StartLine int `json:"startLine"`
		} `json:"region"`
	} `json:"physicalLocation"`
}

func readSARIF(t *testing.T, stdout string) sarifOutput {
	t.Helper()
	var log sarifOutput
	if err := json.Unmarshal([]byte(stdout), &log); err != nil {
		t.Fatalf("%v\n%s", err, stdout)
	}
	return log
}
