//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuguard/gpuguard/e2e/framework"
	"github.com/gpuguard/gpuguard/e2e/framework/controlplane"
)

// leakDenied reports whether a dry-run of a leaking pod in the enforcing namespace is
// denied (true) or allowed with a warning (false).
func leakDenied(ctx context.Context) (bool, error) {
	_, err := s.cp.Client.CoreV1().Pods(enforceNS).Create(ctx, withEnv(plainPod("policy-probe"), allGPUs),
		metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil && !strings.Contains(err.Error(), "gpuguard denied") {
		return false, fmt.Errorf("unexpected error: %w", err)
	}
	return err != nil, nil
}

func waitForEvent(ctx context.Context, reason string) error {
	return framework.Poll(ctx, 30*time.Second, func() (bool, error) {
		events, err := s.cp.Client.CoreV1().Events(releaseNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, e := range events.Items {
			if e.Reason == reason && e.InvolvedObject.Name == policyName {
				return true, nil
			}
		}
		return false, nil
	})
}

func TestPolicyConfigMapLifecycle(t *testing.T) {
	ctx := context.Background()
	defer func() {
		if err := s.writePolicy(ctx, suitePolicy); err != nil {
			t.Fatal(err)
		}
		if err := framework.Poll(ctx, 30*time.Second, func() (bool, error) { return leakDenied(ctx) }); err != nil {
			t.Fatalf("the suite policy did not come back: %v", err)
		}
	}()

	// An edit takes effect within seconds, without a restart.
	if err := s.writePolicy(ctx, suitePolicy+"  mode: warn\n"); err != nil {
		t.Fatal(err)
	}
	if err := framework.Poll(ctx, 30*time.Second, func() (bool, error) { d, err := leakDenied(ctx); return !d, err }); err != nil {
		t.Fatalf("switching the policy to warn did not take effect: %v", err)
	}

	// An invalid edit keeps the warn policy and records an Event.
	if err := s.writePolicy(ctx, suitePolicy+"  mode: loud\n"); err != nil {
		t.Fatal(err)
	}
	if err := waitForEvent(ctx, "PolicyInvalid"); err != nil {
		t.Fatalf("no PolicyInvalid event: %v", err)
	}
	if denied, err := leakDenied(ctx); err != nil || denied {
		t.Errorf("an invalid edit must keep the last good (warn) policy: denied=%v err=%v", denied, err)
	}

	// Deleting the ConfigMap keeps the last good policy too.
	if err := s.cp.Client.CoreV1().ConfigMaps(releaseNS).Delete(ctx, policyName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := waitForEvent(ctx, "PolicyMissing"); err != nil {
		t.Fatalf("no PolicyMissing event: %v", err)
	}
	if denied, err := leakDenied(ctx); err != nil || denied {
		t.Errorf("a deleted ConfigMap must keep the last good policy: denied=%v err=%v", denied, err)
	}

	// Recreated invalid and deleted again: each edit and each deletion is an
	// Event of its own, not a repeat folded into the first.
	invalid, missing := countEvents(t, "PolicyInvalid"), countEvents(t, "PolicyMissing")
	if err := s.writePolicy(ctx, suitePolicy+"  mode: louder\n"); err != nil {
		t.Fatal(err)
	}
	waitEventCount(t, "PolicyInvalid", invalid+1)
	if err := s.cp.Client.CoreV1().ConfigMaps(releaseNS).Delete(ctx, policyName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitEventCount(t, "PolicyMissing", missing+1)
}

// countEvents counts the Events with reason on the policy ConfigMap.
func countEvents(t *testing.T, reason string) int {
	t.Helper()
	events, err := s.cp.Client.CoreV1().Events(releaseNS).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range events.Items {
		if e.Reason == reason && e.InvolvedObject.Name == policyName {
			n++
		}
	}
	return n
}

func waitEventCount(t *testing.T, reason string, n int) {
	t.Helper()
	if err := framework.Poll(context.Background(), 30*time.Second, func() (bool, error) { return countEvents(t, reason) >= n, nil }); err != nil {
		t.Errorf("%d %s Events, want %d: each occurrence must be an Event of its own", countEvents(t, reason), reason, n)
	}
}

func TestFailsClosedWhenTheWebhookIsDown(t *testing.T) {
	ctx := context.Background()
	if err := s.Webhook.Kill(); err != nil {
		t.Fatal(err)
	}
	restarted := false
	defer func() {
		if !restarted {
			_ = s.startWebhook(ctx)
		}
	}()
	pods := s.cp.Client.CoreV1().Pods(enforceNS)
	_, err := pods.Create(ctx, plainPod("while-down"), metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "validate.pods.gpuguard.io") {
		t.Errorf("with gpuguard down, pod creation in a guarded namespace must fail closed, got %v", err)
	}
	other, err := s.cp.Client.CoreV1().Pods(excludedNS).Create(ctx, plainPod("unaffected"), metav1.CreateOptions{})
	if err != nil {
		t.Errorf("an excluded namespace must not depend on gpuguard: %v", err)
	} else {
		deletePod(ctx, excludedNS, other.Name)
	}
	if err := s.startWebhook(ctx); err != nil {
		t.Fatal(err)
	}
	restarted = true
	if err := s.waitEnforcing(ctx); err != nil {
		t.Fatalf("admissions did not resume after a restart: %v", err)
	}
}

// TestCertificateFilesReplaced replaces the serving certificate on disk three times,
// as the kubelet does when a mounted Secret changes, while admissions go on: the
// webhook serves each new certificate and no admission fails.
func TestCertificateFilesReplaced(t *testing.T) {
	ctx := context.Background()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var admitted, failed atomic.Int64
	var firstFailure atomic.Value
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, err := s.cp.Client.CoreV1().Pods(enforceNS).Create(ctx, plainPod("rotation"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
				admitted.Add(1)
				if err != nil {
					failed.Add(1)
					firstFailure.CompareAndSwap(nil, err)
				}
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	for round := range 3 {
		before := servingSerial(t)
		if err := s.CA.WriteServing(s.CertDir); err != nil {
			t.Fatal(err)
		}
		if err := framework.Poll(ctx, time.Minute, func() (bool, error) { return servingSerial(t) != before, nil }); err != nil {
			t.Fatalf("round %d: the webhook never served the replaced certificate: %v", round, err)
		}
		// Keep admitting for a while with the new certificate.
		target := admitted.Load() + 20
		if err := framework.Poll(ctx, time.Minute, func() (bool, error) { return admitted.Load() >= target, nil }); err != nil {
			t.Fatal(err)
		}
	}
	if n := failed.Load(); n > 0 {
		t.Errorf("%d of %d admissions failed during the rotations; first: %v", n, admitted.Load(), firstFailure.Load())
	}
}

// servingSerial is the serial number of the certificate the webhook serves now.
func servingSerial(t *testing.T) string {
	conn, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", s.Webhook.Port), &tls.Config{RootCAs: s.CA.Pool(), ServerName: "localhost"})
	if err != nil {
		t.Fatalf("the webhook's TLS endpoint: %v", err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// TestSelfManagedCertificates runs a second webhook that manages its own
// certificates with cert-controller: it creates its Secret and writes the CA bundle
// into its webhook configuration, and the API server then trusts it.
func TestSelfManagedCertificates(t *testing.T) {
	ctx := context.Background()
	const ns, secret = selfManagedNS, "gpuguard-selfmanaged-tls"
	if _, err := s.cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: ns, Labels: map[string]string{"gpuguard.io/selfmanaged": "true"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := s.cp.Kubeconfig("gpuguard-selfmanaged")
	if err != nil {
		t.Fatal(err)
	}
	certDir := t.TempDir()
	wh, err := controlplane.NewWebhook(s.Binary, kubeconfig, certDir, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	configs, err := controlplane.GPUGuardWebhooks(filepath.Join("..", "charts", "gpuguard"), releaseNS)
	if err != nil {
		t.Fatal(err)
	}
	configs.Mutating.Name, configs.Validating.Name = "gpuguard-selfmanaged", "gpuguard-selfmanaged"
	configs.PointAt(wh.Port, nil) // no CA bundle: cert-controller injects it
	for i := range configs.Mutating.Webhooks {
		configs.Mutating.Webhooks[i].NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"gpuguard.io/selfmanaged": "true"}}
	}
	configs.Validating.Webhooks = nil
	if err := configs.InstallMutating(ctx, s.cp.Client); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = configs.RemoveMutating(ctx, s.cp.Client) }()

	// cert-controller fills the Secret but does not create it (the Helm chart does).
	if _, err := s.cp.Client.CoreV1().Secrets(releaseNS).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: secret, Namespace: releaseNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// No kubelet mounts the Secret here: the webhook writes its files itself.
	wh.Extra = []string{"--cert-secret", releaseNS + "/" + secret, "--write-cert-dir", "--service-name", "gpuguard-webhook",
		"--mutating-webhook-configuration", configs.Mutating.Name, "--extra-dns-names", "localhost"}
	if err := wh.Start(releaseNS + "/" + policyName); err != nil {
		t.Fatal(err)
	}
	defer wh.Stop()
	if err := wh.WaitReady(ctx, 2*time.Minute); err != nil {
		t.Fatalf("self-managed webhook not ready: %v\n%s", err, framework.Tail(wh.Log))
	}
	cfg, err := s.cp.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, configs.Mutating.Name, metav1.GetOptions{})
	if err != nil || len(cfg.Webhooks[0].ClientConfig.CABundle) == 0 {
		t.Fatalf("the CA bundle was not injected: %v", err)
	}
	var stored *corev1.Pod
	err = framework.Poll(ctx, time.Minute, func() (bool, error) {
		stored, err = s.cp.Client.CoreV1().Pods(ns).Create(ctx, plainPod("trusted"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil && lastEnv(stored.Spec.Containers[0], "NVIDIA_VISIBLE_DEVICES") == "void", nil
	})
	if err != nil {
		t.Fatalf("the API server never got a mutation from the self-managed webhook: %v\n%s", err, framework.Tail(wh.Log))
	}
}
