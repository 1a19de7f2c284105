//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"hash/crc32"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/gpuguard/gpuguard/cel"
	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/e2e/framework"
	"github.com/gpuguard/gpuguard/e2e/framework/controlplane"
	"github.com/gpuguard/gpuguard/policy"
	"github.com/gpuguard/gpuguard/testsupport/fixtures"
)

// installBackstop applies the CEL policies rendered from the default policy (or
// removes them) and waits until the API server acts on them.
func (s *suite) installBackstop(ctx context.Context, on bool) error {
	p, err := cel.Render(config.Default(), cel.Options{ExcludedNamespaces: []string{releaseNS, excludedNS, selfManagedNS, chartNamespace}})
	if err != nil {
		return err
	}
	ar := s.cp.Client.AdmissionregistrationV1()
	name := p.Validating.Name
	for _, del := range []func() error{
		func() error { return ar.ValidatingAdmissionPolicyBindings().Delete(ctx, name, metav1.DeleteOptions{}) },
		func() error { return ar.ValidatingAdmissionPolicies().Delete(ctx, name, metav1.DeleteOptions{}) },
		func() error { return ar.MutatingAdmissionPolicyBindings().Delete(ctx, name, metav1.DeleteOptions{}) },
		func() error { return ar.MutatingAdmissionPolicies().Delete(ctx, name, metav1.DeleteOptions{}) },
	} {
		if err := del(); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	if !on {
		return waitBackstopGone(ctx)
	}
	if _, err := ar.ValidatingAdmissionPolicies().Create(ctx, p.Validating, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("the API server refused the rendered ValidatingAdmissionPolicy: %w", err)
	}
	if _, err := ar.ValidatingAdmissionPolicyBindings().Create(ctx, p.ValidatingBinding, metav1.CreateOptions{}); err != nil {
		return err
	}
	if _, err := ar.MutatingAdmissionPolicies().Create(ctx, p.Mutating, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("the API server refused the rendered MutatingAdmissionPolicy: %w", err)
	}
	if _, err := ar.MutatingAdmissionPolicyBindings().Create(ctx, p.MutatingBinding, metav1.CreateOptions{}); err != nil {
		return err
	}
	return nil
}

// waitBackstop waits until the backstop acts, in a namespace that gpuguard's
// webhooks leave out: a plain pod comes back with void (the mutating policy) and a
// leaking pod is denied (the validating one).
func (s *suite) waitBackstop(ctx context.Context) error {
	return framework.Poll(ctx, 2*time.Minute, func() (bool, error) {
		p, err := s.cp.Client.CoreV1().Pods(celProbeNS).Create(ctx, plainPod("backstop-probe"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil || lastEnv(p.Spec.Containers[0], "NVIDIA_VISIBLE_DEVICES") != "void" {
			return false, nil
		}
		return backstopDeniesLeak(ctx)
	})
}

// waitBackstopGone waits until no backstop acts any more. The API server drops
// deleted policies a moment later, each on its own: without waiting, the next
// test sees their effects.
func waitBackstopGone(ctx context.Context) error {
	return framework.Poll(ctx, 2*time.Minute, func() (bool, error) {
		denied, err := backstopDeniesLeak(ctx)
		if err != nil || denied {
			return false, err
		}
		mutated, err := backstopMutates(ctx)
		return !mutated, err
	})
}

// backstopMutates reports whether the backstop's mutating policy still sets
// void, in a namespace that gpuguard's webhooks leave out.
func backstopMutates(ctx context.Context) (bool, error) {
	p, err := s.cp.Client.CoreV1().Pods(celProbeNS).Create(ctx, plainPod("backstop-probe"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		return false, fmt.Errorf("unexpected error: %w", err)
	}
	return lastEnv(p.Spec.Containers[0], "NVIDIA_VISIBLE_DEVICES") == "void", nil
}

// backstopDeniesLeak reports whether the backstop denies a leaking pod, in a
// namespace that gpuguard's webhooks leave out.
func backstopDeniesLeak(ctx context.Context) (bool, error) {
	_, err := s.cp.Client.CoreV1().Pods(celProbeNS).Create(ctx, withEnv(plainPod("backstop-leak"), allGPUs), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil && !strings.Contains(err.Error(), "gpuguard backstop") {
		return false, fmt.Errorf("unexpected error: %w", err)
	}
	return err != nil, nil
}

// restoreWebhooks removes the backstop and puts the suite's webhooks back.
func (s *suite) restoreWebhooks(t *testing.T) {
	ctx := context.Background()
	if err := s.installBackstop(ctx, false); err != nil {
		t.Error(err)
	}
	if err := s.Configs.Install(ctx, s.cp.Client); err != nil {
		t.Fatal(err)
	}
	if err := s.waitEnforcing(ctx); err != nil {
		t.Fatal(err)
	}
}

// withBackstopOnly runs f with the CEL policies installed and gpuguard's webhooks
// removed, then puts the suite back.
func withBackstopOnly(t *testing.T, f func()) {
	ctx := context.Background()
	if err := s.Configs.Remove(ctx, s.cp.Client); err != nil {
		t.Fatal(err)
	}
	defer s.restoreWebhooks(t)
	if err := s.installBackstop(ctx, true); err != nil {
		t.Fatal(err)
	}
	if err := s.waitBackstop(ctx); err != nil {
		t.Fatalf("the CEL backstop never took effect: %v", err)
	}
	f()
}

func webhookOnly(rule string) bool {
	return slices.ContainsFunc(cel.WebhookOnly, func(g cel.Gap) bool { return string(g.Rule) == rule })
}

// backstopRule finds a rule name in a backstop denial ("gpuguard backstop [rule]: ...").
var backstopRule = regexp.MustCompile(`\[([a-z-]+)\]: `)

// TestCELBackstopParity evaluates every plain fixture with the CEL policies alone
// (webhooks removed): each denial of the engine is a denial of the backstop unless
// its rule is on the documented webhook-only list, no pass fixture is denied, and
// pods are stored with the effective NVIDIA_VISIBLE_DEVICES the engine computes.
func TestCELBackstopParity(t *testing.T) {
	dyn, engine := clientAndEngine(t)
	fixtures := plainFixtures(t)
	withBackstopOnly(t, func() {
		for _, f := range fixtures {
			t.Run(f.name, func(t *testing.T) { backstopFixture(t, dyn, engine, f.fixture) })
		}
	})
}

func backstopFixture(t *testing.T, dyn dynamic.Interface, engine *policy.Engine, f *fixture) {
	ctx := context.Background()
	ns := fmt.Sprintf("cel-%08x", crc32.ChecksumIEEE([]byte(t.Name())))
	if err := controlplane.EnsureNamespace(ctx, s.cp, ns, nil); err != nil {
		t.Fatal(err)
	}
	typed, u := fixtureObject(t, f, ns)
	want, err := engine.Admit(ctx, policy.Request{Operation: admissionv1.Create, Namespace: ns, Object: typed,
		ConfigMaps: fixtures.ConfigMaps(f.ConfigMaps).InNamespace(ns)})
	if err != nil {
		t.Fatal(err)
	}
	created, err := dyn.Resource(resources[u.GetKind()]).Namespace(ns).Create(ctx, u, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	switch {
	case apierrors.IsInvalid(err) && !strings.Contains(err.Error(), "AdmissionPolicy"):
		t.Skipf("not a valid object for the API server: %v", err)
	case err != nil && !strings.Contains(err.Error(), "gpuguard backstop"):
		t.Fatalf("unexpected error: %v", err)
	case err != nil && want.Allowed:
		t.Fatalf("the backstop denied a pod the engine allows: %v", err)
	case err == nil && !want.Allowed && u.GetKind() != "Pod":
		// Pod controllers are webhook-only: their pods are judged when created.
	case err == nil && !want.Allowed:
		for _, v := range want.Violations {
			if !webhookOnly(string(v.Rule)) {
				t.Errorf("the backstop allowed what the engine denies by %s, which is not a webhook-only rule: %s", v.Rule, v.Message)
			}
		}
	case err != nil:
		for _, m := range backstopRule.FindAllStringSubmatch(err.Error(), -1) {
			if !slices.ContainsFunc(want.Violations, func(v policy.Violation) bool { return string(v.Rule) == m[1] }) {
				t.Errorf("the backstop denied by %s, which the engine does not: %v", m[1], err)
			}
		}
	}
	if err != nil || !want.Allowed {
		return
	}
	if pod, ok := typed.(*corev1.Pod); ok {
		compareEffectiveDevices(t, pod, want, created)
	}
}

// compareEffectiveDevices checks that every container ends up with the effective
// NVIDIA_VISIBLE_DEVICES the engine's patch gives it.
func compareEffectiveDevices(t *testing.T, pod *corev1.Pod, want policy.Result, created *unstructured.Unstructured) {
	stored, expected := storedAndExpected(t, pod, want, created)
	for i, c := range stored {
		if got, exp := lastEnv(c, "NVIDIA_VISIBLE_DEVICES"), lastEnv(expected[i], "NVIDIA_VISIBLE_DEVICES"); got != exp {
			t.Errorf("container %s: NVIDIA_VISIBLE_DEVICES=%s with the backstop, %s with the engine", c.Name, got, exp)
		}
	}
}

// TestCELBackstopJudgesStatusUpdates: with the backstop alone, a pods/status
// update that adds a device annotation is denied, and a status report that
// leaves annotations alone is admitted (the match condition lets it through
// unjudged).
func TestCELBackstopJudgesStatusUpdates(t *testing.T) {
	ctx := context.Background()
	pods := s.cp.Client.CoreV1().Pods(enforceNS)
	withBackstopOnly(t, func() {
		created, err := pods.Create(ctx, plainPod("status-backstop"), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer deletePod(ctx, enforceNS, created.Name)
		report := created.DeepCopy()
		report.Status.Phase = corev1.PodRunning
		if created, err = pods.UpdateStatus(ctx, report, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("a status report was refused: %v", err)
		}
		created.Annotations = map[string]string{"devices.noderesource.dev/container.app": "- path: /dev/nvidia0\n"}
		_, err = pods.UpdateStatus(ctx, created, metav1.UpdateOptions{})
		if err == nil || !strings.Contains(err.Error(), "gpuguard backstop [device-annotation]") {
			t.Errorf("a status update adding a device annotation must be denied by the backstop, got %v", err)
		}
	})
}

// TestCELBackstopWithTheWebhookDown installs the backstop beside webhooks that fail
// open (failurePolicy Ignore, the availability option the backstop makes safe),
// kills the webhook, and checks that the core guarantees hold; with the webhook up
// again, users see the webhook's own message.
func TestCELBackstopWithTheWebhookDown(t *testing.T) {
	ctx := context.Background()
	installFailOpen(t)
	defer s.restoreWebhooks(t)
	if err := s.Webhook.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := s.waitBackstop(ctx); err != nil {
		_ = s.startWebhook(ctx)
		t.Fatalf("with the webhook down, the backstop did not enforce: %v", err)
	}
	pods := s.cp.Client.CoreV1().Pods(enforceNS)
	_, err := pods.Create(ctx, withEnv(plainPod("while-down-leak"), allGPUs), metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "gpuguard backstop [device-env]") {
		t.Errorf("with the webhook down, a leaking pod must be denied by the backstop, got %v", err)
	}
	stored, err := pods.Create(ctx, plainPod("while-down-plain"), metav1.CreateOptions{})
	if err != nil {
		t.Errorf("with the webhook down, a plain pod must still be admitted: %v", err)
	} else {
		defer deletePod(ctx, enforceNS, stored.Name)
		if got := lastEnv(stored.Spec.Containers[0], "NVIDIA_VISIBLE_DEVICES"); got != "void" {
			t.Errorf("with the webhook down, a plain pod was stored with NVIDIA_VISIBLE_DEVICES=%s, want void", got)
		}
	}

	if err := s.startWebhook(ctx); err != nil {
		t.Fatal(err)
	}
	// With both up, the mutating webhook judges first: users see its message.
	err = framework.Poll(ctx, time.Minute, func() (bool, error) {
		_, err = pods.Create(ctx, withEnv(plainPod("both-up-leak"), allGPUs), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "gpuguard denied"), nil
	})
	if err != nil {
		t.Errorf("with the webhook back, its message must be the one users see: %v", err)
	}
}

// TestWebhookKeepsTheBackstopInSync runs a webhook with --cel-backstop: it applies
// the CEL policies rendered from the live policy ConfigMap, and re-applies them when
// the ConfigMap changes.
func TestWebhookKeepsTheBackstopInSync(t *testing.T) {
	ctx := context.Background()
	const name, owner = "gpuguard-synced", "gpuguard-synced-owner"
	role, err := s.cp.Client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: owner}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wh := startClusterWebhook(t, "gpuguard-backstop", "--cel-backstop", "--cel-backstop-name", name, "--cel-backstop-exclude-namespace", releaseNS,
		"--validating-webhook-configuration", s.Configs.Validating.Name, "--cel-backstop-owner", owner)
	ar := s.cp.Client.AdmissionregistrationV1()
	defer func() {
		_ = wh.Stop()
		_ = s.cp.Client.RbacV1().ClusterRoles().Delete(ctx, owner, metav1.DeleteOptions{})
		removeBackstop(ctx, t, name)
		if err := s.writePolicy(ctx, suitePolicy); err != nil {
			t.Error(err)
		}
	}()
	action := func() (string, error) {
		b, err := ar.ValidatingAdmissionPolicyBindings().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return "", nil
		}
		if _, err := ar.MutatingAdmissionPolicies().Get(ctx, name, metav1.GetOptions{}); err != nil {
			return "", nil
		}
		return string(b.Spec.ValidationActions[0]), nil
	}
	if err := framework.Poll(ctx, time.Minute, func() (bool, error) { a, err := action(); return a == "Deny", err }); err != nil {
		t.Fatalf("the webhook did not apply the backstop: %v\n%s", err, framework.Tail(wh.Log))
	}
	// Uninstalling gpuguard (deleting the webhook's ClusterRole) takes the
	// backstop with it, through the garbage collector; deleting the webhook
	// configurations does not (the cluster suite shows both).
	vap, err := ar.ValidatingAdmissionPolicies().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if owners := vap.OwnerReferences; len(owners) != 1 || owners[0].Kind != "ClusterRole" || owners[0].UID != role.UID {
		t.Errorf("the backstop must be owned by the ClusterRole %s, got %+v", owner, owners)
	}
	if err := s.writePolicy(ctx, suitePolicy+"  mode: warn\n"); err != nil {
		t.Fatal(err)
	}
	if err := framework.Poll(ctx, time.Minute, func() (bool, error) { a, err := action(); return a == "Warn", err }); err != nil {
		t.Fatalf("a policy edit did not reach the backstop: %v\n%s", err, framework.Tail(wh.Log))
	}
}

// TestEveryRenderingCompiles has the API server compile (server-side dry-run) the
// CEL rendered from a policy that turns on every optional part: extra device
// variables, unprefixed envFrom denied, advisories denied, every exemption kind
// (a service account's waiver of some rules among them) and the warn mode.
func TestEveryRenderingCompiles(t *testing.T) {
	ctx := context.Background()
	p, err := config.Parse("every-option.yaml", []byte(`apiVersion: gpuguard.io/v1alpha1
kind: GPUGuardPolicy
spec:
  mode: warn
  env:
    extraDeviceVariables: [DOCKER_RESOURCE_GPU]
    unprefixedEnvFromOnGPU: deny
    protectedVariables:
      - {name: NVIDIA_GDS, allowOnGPUContainers: true, allowedValues: [enabled]}
      - {name: NVIDIA_MOFED, allowOnGPUContainers: true}
      - {name: NVIDIA_IMEX_CHANNELS}
  advisories: {privileged: deny, nvidiaRuntimeClass: deny}
  exemptions:
    namespaces: [gpu-operator]
    serviceAccounts:
      - {namespace: ci, name: smoke}
      - {namespace: monitoring, name: exporter, rules: [inject-void, pin-parent-groups, sensitive-hostpath, privileged]}
    usernames: ["system:serviceaccount:ci:deployer"]
`))
	if err != nil {
		t.Fatal(err)
	}
	rendered, err := cel.Render(p, cel.Options{Name: "every-option"})
	if err != nil {
		t.Fatal(err)
	}
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: "Strict"}
	ar := s.cp.Client.AdmissionregistrationV1()
	if _, err := ar.ValidatingAdmissionPolicies().Create(ctx, rendered.Validating, dry); err != nil {
		t.Errorf("ValidatingAdmissionPolicy: %v", err)
	}
	if _, err := ar.ValidatingAdmissionPolicyBindings().Create(ctx, rendered.ValidatingBinding, dry); err != nil {
		t.Errorf("ValidatingAdmissionPolicyBinding: %v", err)
	}
	if _, err := ar.MutatingAdmissionPolicies().Create(ctx, rendered.Mutating, dry); err != nil {
		t.Errorf("MutatingAdmissionPolicy: %v", err)
	}
	if _, err := ar.MutatingAdmissionPolicyBindings().Create(ctx, rendered.MutatingBinding, dry); err != nil {
		t.Errorf("MutatingAdmissionPolicyBinding: %v", err)
	}
}
