//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuguard/gpuguard/cel"
	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/e2e/framework"
	"github.com/gpuguard/gpuguard/e2e/framework/controlplane"
)

// prefilteredWebhooks are the chart's pod webhooks, which the chart has the
// webhook keep the pre-filter on.
var prefilteredWebhooks = []string{"mutate.pods.gpuguard.io", "validate.pods.gpuguard.io"}

// TestPrefilterKeepsOrdinaryPodsFromTheWebhooks runs a webhook with
// --cel-backstop and --prefilter-webhook, as the chart does: it puts the
// pre-filter rendered from the live policy on gpuguard's pod webhooks. Then
// an ordinary pod is injected and judged by the backstop inside the API
// server and reaches no webhook, while a pod with something to judge still
// gets the webhook's own denial.
func TestPrefilterKeepsOrdinaryPodsFromTheWebhooks(t *testing.T) {
	ctx := context.Background()
	const name = "gpuguard-prefiltered"
	wh := startClusterWebhook(t, "gpuguard-prefilter", "--cel-backstop", "--cel-backstop-name", name,
		"--cel-backstop-exclude-namespace", releaseNS,
		"--prefilter-webhook", prefilteredWebhooks[0], "--prefilter-webhook", prefilteredWebhooks[1],
		"--mutating-webhook-configuration", s.Configs.Mutating.Name, "--validating-webhook-configuration", s.Configs.Validating.Name)
	defer func() {
		_ = wh.Stop()
		removeBackstop(ctx, t, name)
		// The suite's configurations, as rendered: without the condition.
		if err := s.Configs.Install(ctx, s.cp.Client); err != nil {
			t.Error(err)
		}
		if err := s.waitEnforcing(ctx); err != nil {
			t.Error(err)
		}
	}()
	p, err := config.Parse("suite policy", []byte(suitePolicy))
	if err != nil {
		t.Fatal(err)
	}
	want, err := cel.Prefilter(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := framework.Poll(ctx, time.Minute, func() (bool, error) { return prefilterApplied(ctx, want) }); err != nil {
		t.Fatalf("the webhook did not put the pre-filter on %v: %v\n%s", prefilteredWebhooks, err, framework.Tail(wh.Log))
	}
	pods := s.cp.Client.CoreV1().Pods(enforceNS)
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	var last string
	err = framework.Poll(ctx, time.Minute, func() (bool, error) {
		before, err := s.Webhook.Decisions(ctx, "")
		if err != nil {
			return false, err
		}
		got, err := pods.Create(ctx, plainPod("ordinary"), dry)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		after, err := s.Webhook.Decisions(ctx, "")
		env := got.Spec.Containers[0].Env
		last = fmt.Sprintf("webhook decisions %v -> %v, env %v", before, after, env)
		return err == nil && after == before && len(env) == 1 && env[0].Value == "void", err
	})
	if err != nil {
		t.Fatalf("an ordinary pod should get void from the backstop and reach no webhook: %v (last: %s)", err, last)
	}
	before, err := s.Webhook.Decisions(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	_, err = pods.Create(ctx, withEnv(plainPod("miner"), allGPUs), dry)
	if err == nil || !strings.Contains(err.Error(), "gpuguard denied") {
		t.Errorf("a pod with NVIDIA_VISIBLE_DEVICES=all must still get the webhook's denial, got %v", err)
	}
	if after, err := s.Webhook.Decisions(ctx, ""); err != nil || after <= before {
		t.Errorf("the violating pod did not reach the webhook: decisions %v -> %v (%v)", before, after, err)
	}
}

// prefilterApplied says whether both pod webhooks carry the condition
// exactly, owned by the webhook's field manager.
func prefilterApplied(ctx context.Context, want string) (bool, error) {
	reg := s.cp.Client.AdmissionregistrationV1()
	m, err := reg.MutatingWebhookConfigurations().Get(ctx, s.Configs.Mutating.Name, metav1.GetOptions{})
	if err != nil {
		return false, err
	}
	v, err := reg.ValidatingWebhookConfigurations().Get(ctx, s.Configs.Validating.Name, metav1.GetOptions{})
	if err != nil {
		return false, err
	}
	conditions := map[string][]admissionregistrationv1.MatchCondition{}
	for _, w := range m.Webhooks {
		conditions[w.Name] = w.MatchConditions
	}
	for _, w := range v.Webhooks {
		conditions[w.Name] = w.MatchConditions
	}
	for _, name := range prefilteredWebhooks {
		if !slices.Contains(conditions[name], admissionregistrationv1.MatchCondition{Name: cel.PrefilterName, Expression: want}) {
			return false, nil
		}
	}
	owned := slices.ContainsFunc(m.ManagedFields, func(f metav1.ManagedFieldsEntry) bool { return f.Manager == "gpuguard-prefilter" })
	return owned, nil
}

// startClusterWebhook starts a webhook of its own (in-cluster mode, on the
// suite's policy ConfigMap) with extra flags, as the user named.
func startClusterWebhook(t *testing.T, user string, extra ...string) *controlplane.Webhook {
	t.Helper()
	return startClusterWebhookOn(t, user, policyName, extra...)
}

// startClusterWebhookOn is startClusterWebhook reading the policy from
// ConfigMap policyCM of the release namespace.
func startClusterWebhookOn(t *testing.T, user, policyCM string, extra ...string) *controlplane.Webhook {
	t.Helper()
	kubeconfig, err := s.cp.Kubeconfig(user)
	if err != nil {
		t.Fatal(err)
	}
	return startWebhookWith(t, kubeconfig, policyCM, extra...)
}

// startWebhookWith is startClusterWebhookOn with the webhook's kubeconfig.
func startWebhookWith(t *testing.T, kubeconfig, policyCM string, extra ...string) *controlplane.Webhook {
	t.Helper()
	wh, err := controlplane.NewWebhook(s.Binary, kubeconfig, s.CertDir, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	wh.Extra = extra
	if err := wh.Start(releaseNS + "/" + policyCM); err != nil {
		t.Fatal(err)
	}
	return wh
}

// removeBackstop deletes a backstop the test had applied and waits until
// the API server no longer acts on it.
func removeBackstop(ctx context.Context, t *testing.T, name string) {
	ar := s.cp.Client.AdmissionregistrationV1()
	_ = ar.ValidatingAdmissionPolicyBindings().Delete(ctx, name, metav1.DeleteOptions{})
	_ = ar.ValidatingAdmissionPolicies().Delete(ctx, name, metav1.DeleteOptions{})
	_ = ar.MutatingAdmissionPolicyBindings().Delete(ctx, name, metav1.DeleteOptions{})
	_ = ar.MutatingAdmissionPolicies().Delete(ctx, name, metav1.DeleteOptions{})
	if err := waitBackstopGone(ctx); err != nil {
		t.Errorf("the backstop still acts after its deletion: %v", err)
	}
}
