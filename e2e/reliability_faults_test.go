//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuguard/gpuguard/e2e/framework"
	"github.com/gpuguard/gpuguard/e2e/framework/controlplane"
)

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// invalidPolicies are edits the webhook must refuse, keeping the policy in
// force: nil deletes the ConfigMap.
var invalidPolicies = []*string{
	ptr(suitePolicy + "  mode: loud\n"),
	ptr(suitePolicy + "  injectVoidd: false\n"),
	ptr(suitePolicy + "  action: remove\n"),
	ptr("apiVersion: gpuguard.io/v1alpha1\nkind: GPUGuardPolicy\nspec: [\n"),
	ptr("apiVersion: gpuguard.io/v9\nkind: GPUGuardPolicy\nspec: {}\n"),
	ptr("kind: Something\n"),
	ptr(""),
	ptr(suitePolicy + "  gpuResources: [\"\"]\n"),
	ptr(suitePolicy + "  mode: [enforce]\n"),
	nil,
}

func ptr(s string) *string { return &s }

// testPolicyChurn edits the policy ConfigMap every 100 ms for 5 s, with
// invalid edits of several kinds and deletions between valid ones, while
// clients create pods: no edit may ever weaken enforcement, and the webhook
// keeps answering throughout.
func testPolicyChurn(t *testing.T) {
	ctx := context.Background()
	l := newLoad(t, "churn")
	lines := decisionLines(t)
	stop := l.background(ctx, 8)
	edits, deletions := 0, 0
	tick := time.NewTicker(100 * time.Millisecond) // the churn's pace, not a wait for a condition
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); <-tick.C {
		edit := invalidPolicies[edits/2%len(invalidPolicies)]
		var err error
		switch {
		case edits%2 == 1:
			err = s.writePolicy(ctx, suitePolicy)
		case edit == nil:
			err = s.cp.Client.CoreV1().ConfigMaps(releaseNS).Delete(ctx, policyName, metav1.DeleteOptions{})
			deletions++
		default:
			err = s.writePolicy(ctx, *edit)
		}
		if err != nil {
			t.Errorf("edit %d: %v", edits, err)
		}
		edits++
	}
	tick.Stop()
	if err := s.writePolicy(ctx, suitePolicy); err != nil {
		t.Fatal(err)
	}
	stop()
	a, d, f := l.counts()
	t.Logf("reliability: policy churn: %d ConfigMap edits in 5s (%d invalid kinds, %d deletions) under 8 clients: %d admitted with void, %d denied, %d client errors",
		edits, len(invalidPolicies)-1, deletions, a, d, f)
	if f != 0 {
		t.Errorf("%d creates failed during policy churn: %v", f, l.failed)
	}
	expectOneLinePerDecision(t, lines, l)
	l.check(t)
}

// testCrashFailClosed kills the webhook with SIGKILL under load, with the
// validating webhook failing closed: creates fail while it is down, and none
// is stored unguarded; after a restart they succeed again.
func testCrashFailClosed(t *testing.T) {
	ctx := context.Background()
	l := newLoad(t, "crash-fail")
	stop := l.background(ctx, 8)
	defer stop()
	l.waitCounts(t, 30, 0, "before the crash")
	if err := s.Webhook.Kill(); err != nil {
		t.Fatal(err)
	}
	a, _, _ := l.counts()
	l.waitCounts(t, 0, 20, "while the webhook is down")
	if err := s.startWebhook(ctx); err != nil {
		t.Fatal(err)
	}
	l.waitCounts(t, a+30, 0, "after the restart")
	stop()
	a, d, f := l.counts()
	t.Logf("reliability: kill -9 under failurePolicy Fail: %d admitted with void, %d denied, %d refused while down, 0 unguarded", a, d, f)
	l.check(t)
}

// testCrashFailOpen kills the webhook under load with every webhook failing
// open and the CEL backstop installed: while it is down the backstop injects
// void and denies leaks, so creates go on and none is unguarded.
func testCrashFailOpen(t *testing.T) {
	ctx := context.Background()
	installFailOpen(t)
	defer s.restoreWebhooks(t)
	l := newLoad(t, "crash-ignore")
	stop := l.background(ctx, 8)
	defer stop()
	l.waitCounts(t, 30, 0, "before the crash")
	if err := s.Webhook.Kill(); err != nil {
		t.Fatal(err)
	}
	a, d, _ := l.counts()
	l.waitCounts(t, a+30, 0, "while the webhook is down (the backstop admits)")
	if _, d2, _ := l.counts(); d2 <= d {
		t.Errorf("no leaking pod was denied while the webhook was down")
	}
	if err := s.startWebhook(ctx); err != nil {
		t.Fatal(err)
	}
	a, _, _ = l.counts()
	l.waitCounts(t, a+30, 0, "after the restart")
	stop()
	a, d, f := l.counts()
	t.Logf("reliability: kill -9 under failurePolicy Ignore with the CEL backstop: %d admitted with void, %d denied, %d client errors, 0 unguarded", a, d, f)
	if f != 0 {
		t.Errorf("%d creates failed with every webhook failing open: %v", f, l.failed)
	}
	l.check(t)
}

// testNoPolicyAtStart starts the webhook while its ConfigMap holds no valid
// policy, with every webhook failing open and the CEL backstop installed. A
// webhook without a policy would leave pods to the failure policy: instead
// it stands in the built-in default policy, says so with a PolicyFallback
// Event and gpuguard_policy_fallback, and is ready: a plain pod is stored
// with void, a leaking one is denied by the webhook itself. With
// --policy-fallback=false it keeps its port closed and the backstop alone
// decides.
func testNoPolicyAtStart(t *testing.T) {
	ctx := context.Background()
	installFailOpen(t)
	defer s.restoreWebhooks(t)
	restartWithInvalidPolicy(t)
	defer restoreValidPolicy(t)
	if err := s.Webhook.WaitReady(ctx, time.Minute); err != nil {
		t.Fatalf("the webhook did not become ready on the fallback policy: %v", err)
	}
	waitEventCount(t, "PolicyFallback", 1)
	if m, err := s.Webhook.Metrics(ctx); err != nil || m["gpuguard_policy_fallback"] != 1 {
		t.Errorf("gpuguard_policy_fallback = %v (%v), want 1", m["gpuguard_policy_fallback"], err)
	}
	before, err := s.Webhook.Decisions(ctx, `decision="deny"`)
	if err != nil {
		t.Fatal(err)
	}
	l := newLoad(t, "fallback")
	l.run(ctx, 4, 15, nil)
	a, d, f := l.counts()
	after, err := s.Webhook.Decisions(ctx, `decision="deny"`)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("reliability: no valid policy at start, on the fallback policy: %d admitted with void, %d denied (%v by the webhook), %d client errors", a, d, after-before, f)
	if f != 0 || a == 0 || d == 0 || after-before < float64(d) {
		t.Errorf("%d admitted, %d denied (%v by the webhook), %d client errors; want the webhook to admit and deny, and no error: %v", a, d, after-before, f, l.failed)
	}
	l.check(t)
	t.Run("without fallback the backstop decides", testNoPolicyNoFallback)
}

// testNoPolicyNoFallback: with --policy-fallback=false the webhook never
// opens its port without a policy, so the API server ignores it and the
// backstop's rules apply.
func testNoPolicyNoFallback(t *testing.T) {
	ctx := context.Background()
	s.Webhook.Extra = append(s.Webhook.Extra, "--policy-fallback=false")
	defer func() { s.Webhook.Extra = s.Webhook.Extra[:len(s.Webhook.Extra)-1] }()
	restartWithInvalidPolicy(t)
	if conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", s.Webhook.Port)); err == nil {
		conn.Close()
		t.Error("the webhook opened its port without a policy")
	}
	l := newLoad(t, "no-policy")
	l.run(ctx, 4, 15, nil)
	a, d, f := l.counts()
	t.Logf("reliability: no valid policy at start, no fallback, failurePolicy Ignore with the CEL backstop: %d admitted with void, %d denied by the backstop, %d client errors", a, d, f)
	if f != 0 || a == 0 || d == 0 {
		t.Errorf("%d admitted, %d denied, %d client errors; want the backstop to admit and deny, and no error: %v", a, d, f, l.failed)
	}
	l.check(t)
}

// restartWithInvalidPolicy kills the webhook, writes an invalid policy and
// starts it again, waiting until it has read the policy.
func restartWithInvalidPolicy(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	if err := s.Webhook.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := s.writePolicy(ctx, suitePolicy+"  mode: loud\n"); err != nil {
		t.Fatal(err)
	}
	logged := len(readFile(t, s.Webhook.Log))
	if err := s.Webhook.Start(releaseNS + "/" + policyName); err != nil {
		t.Fatal(err)
	}
	if err := framework.Poll(ctx, time.Minute, func() (bool, error) {
		return strings.Contains(readFile(t, s.Webhook.Log)[logged:], `spec.mode: Unsupported value: \"loud\"`), nil
	}); err != nil {
		t.Fatal("the restarted webhook never read the invalid policy")
	}
}

// restoreValidPolicy writes the suite's policy back and waits for the
// webhook to serve it.
func restoreValidPolicy(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	if err := s.writePolicy(ctx, suitePolicy); err != nil {
		t.Fatal(err)
	}
	if err := s.Webhook.WaitReady(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
}

// installFailOpen makes every webhook fail open and installs the CEL
// backstop; the caller restores the suite's webhooks.
func installFailOpen(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	open := admissionregistrationv1.Ignore
	failOpen := &controlplane.WebhookConfigurations{Mutating: s.Configs.Mutating.DeepCopy(), Validating: s.Configs.Validating.DeepCopy()}
	for i := range failOpen.Validating.Webhooks {
		failOpen.Validating.Webhooks[i].FailurePolicy = &open
	}
	if err := failOpen.Install(ctx, s.cp.Client); err != nil {
		t.Fatal(err)
	}
	if err := s.installBackstop(ctx, true); err != nil {
		t.Fatal(err)
	}
	if err := s.waitBackstop(ctx); err != nil {
		t.Fatal(err)
	}
}

// testProjectedCertificateRotation serves the certificate the way a kubelet
// mounts a Secret (a cert-manager Secret included): files are symlinks
// through ..data to a timestamped directory, and each update swaps ..data
// at once. Three rotations under load: every one is served, and no create
// fails.
func testProjectedCertificateRotation(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	if err := projectCertificate(dir, 0); err != nil {
		t.Fatal(err)
	}
	restartWithCertDir(t, dir)
	defer restartWithCertDir(t, s.CertDir)
	l := newLoad(t, "rotation")
	stop := l.background(ctx, 4)
	defer stop()
	for round := 1; round <= 3; round++ {
		before := servingSerial(t)
		if err := projectCertificate(dir, round); err != nil {
			t.Fatal(err)
		}
		if err := framework.Poll(ctx, 2*time.Minute, func() (bool, error) { return servingSerial(t) != before, nil }); err != nil {
			t.Fatalf("rotation %d: the webhook never served the new certificate", round)
		}
		a, _, _ := l.counts()
		l.waitCounts(t, a+20, 0, "after a rotation")
	}
	stop()
	a, d, f := l.counts()
	t.Logf("reliability: 3 kubelet-style certificate rotations under 4 clients: %d admitted with void, %d denied, %d client errors", a, d, f)
	if f != 0 {
		t.Errorf("%d creates failed during the rotations: %v", f, l.failed)
	}
	l.check(t)
}

// projectCertificate writes a new serving certificate as the kubelet's atomic
// writer updates a Secret volume: a fresh directory, then ..data swapped to
// it by rename, then the old directory removed.
func projectCertificate(dir string, round int) error {
	ts := filepath.Join(dir, "..round-"+time.Now().Format("150405.000000000"))
	if err := os.Mkdir(ts, 0o700); err != nil {
		return err
	}
	if err := s.CA.WriteServing(ts); err != nil {
		return err
	}
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		return err
	}
	if round == 0 {
		for _, f := range []string{"tls.crt", "tls.key"} {
			if err := os.Symlink(filepath.Join("..data", f), filepath.Join(dir, f)); err != nil {
				return err
			}
		}
	}
	if old != "" {
		return os.RemoveAll(filepath.Join(dir, old))
	}
	return nil
}

func restartWithCertDir(t *testing.T, dir string) {
	t.Helper()
	ctx := context.Background()
	if err := s.Webhook.Stop(); err != nil {
		t.Fatal(err)
	}
	s.Webhook.CertDir = dir
	if err := s.startWebhook(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.waitEnforcing(ctx); err != nil {
		t.Fatal(err)
	}
}
