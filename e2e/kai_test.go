//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/gpuguard/gpuguard/cel"
	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/e2e/framework"
	"github.com/gpuguard/gpuguard/internal/wellknown"
	"github.com/gpuguard/gpuguard/policy"
)

// kaiBinder is the KAI binder's user in this test's policy.
const kaiBinder = "system:serviceaccount:kai-scheduler:binder"

// kaiPod is a fractional pod as KAI Scheduler's admission leaves it: the
// fraction container takes NVIDIA_VISIBLE_DEVICES, RUNAI_NUM_OF_GPUS and
// GPU_PORTION from PREFIX-0 and its env from PREFIX-0-evar.
func kaiPod(name string) *corev1.Pod {
	const prefix = "train-x7k2p9q-shared-gpu"
	ref := func(env string) corev1.EnvVar {
		return corev1.EnvVar{Name: env, ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: prefix + "-0"}, Key: env}}}
	}
	p := plainPod(name)
	p.Annotations = map[string]string{"gpu-fraction": "0.5", "runai/shared-gpu-configmap": prefix}
	p.Spec.SchedulerName = "kai-scheduler"
	c := &p.Spec.Containers[0]
	c.Env = []corev1.EnvVar{ref("NVIDIA_VISIBLE_DEVICES"), ref("RUNAI_NUM_OF_GPUS"), ref("GPU_PORTION")}
	c.EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{
		LocalObjectReference: corev1.LocalObjectReference{Name: prefix + "-0-evar"}, Optional: new(false)}}}
	return p
}

// TestKAIFractionsThroughTheAPIServer runs a webhook whose policy turns the
// KAI fraction integration on, with its backstop, as the only gpuguard the
// API server calls: a KAI-shaped fractional pod is admitted with its
// ConfigMap reference and no void; the forged variants are denied; only
// KAI's binder may write ConfigMaps with the fractions' names. Then the
// backstop alone, with the webhooks removed, does the same.
func TestKAIFractionsThroughTheAPIServer(t *testing.T) {
	ctx := context.Background()
	const name, policyCM = "gpuguard-kai", "gpuguard-kai-policy"
	p := config.Default()
	p.Spec.Integrations.KAIScheduler = config.KAIScheduler{Fractions: true, SchedulerNames: []string{"kai-scheduler"},
		BinderServiceAccounts: []string{kaiBinder}}
	doc, err := sigsyaml.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	cms := s.cp.Client.CoreV1().ConfigMaps(releaseNS)
	if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: policyCM},
		Data: map[string]string{config.ConfigMapKey: string(doc)}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wh := startClusterWebhookOn(t, "gpuguard-kai", policyCM, "--cel-backstop", "--cel-backstop-name", name,
		"--cel-backstop-exclude-namespace", releaseNS, "--validating-webhook-configuration", s.Configs.Validating.Name)
	defer func() {
		_ = wh.Stop()
		removeBackstop(ctx, t, name)
		ar := s.cp.Client.AdmissionregistrationV1()
		_ = ar.ValidatingAdmissionPolicyBindings().Delete(ctx, cel.KAIGuardName(name), metav1.DeleteOptions{})
		_ = ar.ValidatingAdmissionPolicies().Delete(ctx, cel.KAIGuardName(name), metav1.DeleteOptions{})
		_ = cms.Delete(ctx, policyCM, metav1.DeleteOptions{})
		s.Configs.PointAt(s.Webhook.Port, s.CA.PEM)
		if err := s.Configs.Install(ctx, s.cp.Client); err != nil {
			t.Error(err)
		}
		if err := s.waitEnforcing(ctx); err != nil {
			t.Error(err)
		}
	}()
	if err := wh.WaitReady(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	s.Configs.PointAt(wh.Port, s.CA.PEM)
	if err := s.Configs.Install(ctx, s.cp.Client); err != nil {
		t.Fatal(err)
	}
	waitConfigMapGuard(t)
	checkKAIPods(t, "webhooks and backstop")
	checkKAIConfigMaps(t)
	if err := s.Configs.Remove(ctx, s.cp.Client); err != nil {
		t.Fatal(err)
	}
	checkKAIPods(t, "backstop alone")
}

// TestKAIGuardAloneThroughTheAPIServer: on an API server without
// MutatingAdmissionPolicy (Kubernetes 1.30 to 1.35) the rest of the backstop
// cannot run, but KAI's fractions still need their ConfigMap guard, a
// ValidatingAdmissionPolicy. A webhook with --cel-backstop-kai-guard-only
// applies it alone: tenants are refused the fractions' ConfigMaps, KAI's
// binder is not, and no other backstop object is written.
func TestKAIGuardAloneThroughTheAPIServer(t *testing.T) {
	ctx := context.Background()
	const name, policyCM = "gpuguard-kai-alone", "gpuguard-kai-alone-policy"
	p := config.Default()
	p.Spec.Integrations.KAIScheduler = config.KAIScheduler{Fractions: true, SchedulerNames: []string{"kai-scheduler"},
		BinderServiceAccounts: []string{kaiBinder}}
	doc, err := sigsyaml.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	cms := s.cp.Client.CoreV1().ConfigMaps(releaseNS)
	if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: policyCM},
		Data: map[string]string{config.ConfigMapKey: string(doc)}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ar := s.cp.Client.AdmissionregistrationV1()
	wh := startClusterWebhookOn(t, "gpuguard-kai", policyCM, "--cel-backstop", "--cel-backstop-kai-guard-only",
		"--cel-backstop-name", name, "--cel-backstop-exclude-namespace", releaseNS)
	defer func() {
		_ = wh.Stop()
		_ = ar.ValidatingAdmissionPolicyBindings().Delete(ctx, cel.KAIGuardName(name), metav1.DeleteOptions{})
		_ = ar.ValidatingAdmissionPolicies().Delete(ctx, cel.KAIGuardName(name), metav1.DeleteOptions{})
		_ = cms.Delete(ctx, policyCM, metav1.DeleteOptions{})
		waitConfigMapGuardGone(t)
	}()
	if err := wh.WaitReady(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	waitConfigMapGuard(t)
	checkKAIConfigMaps(t)
	if _, err := ar.ValidatingAdmissionPolicies().Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the guard alone must write no backstop ValidatingAdmissionPolicy: %v", err)
	}
	if _, err := ar.MutatingAdmissionPolicies().Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the guard alone must write no MutatingAdmissionPolicy: %v", err)
	}
}

// TestKAIFractionsRefusedWithoutTheGuard: a webhook that applies no
// backstop, given a policy that turns KAI's fractions on, does not put it in
// force: it says why in a PolicyInvalid Event on the ConfigMap, and the API
// server's reviews of a KAI-shaped fractional pod are judged by the built-in
// policy, which denies its ConfigMap reference.
func TestKAIFractionsRefusedWithoutTheGuard(t *testing.T) {
	ctx := context.Background()
	const policyCM = "gpuguard-kai-unguarded-policy"
	p := config.Default()
	p.Spec.Integrations.KAIScheduler = config.KAIScheduler{Fractions: true, SchedulerNames: []string{"kai-scheduler"},
		BinderServiceAccounts: []string{kaiBinder}}
	doc, err := sigsyaml.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	cms := s.cp.Client.CoreV1().ConfigMaps(releaseNS)
	if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: policyCM},
		Data: map[string]string{config.ConfigMapKey: string(doc)}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wh := startClusterWebhookOn(t, "gpuguard-kai", policyCM)
	defer func() {
		_ = wh.Stop()
		_ = cms.Delete(ctx, policyCM, metav1.DeleteOptions{})
		s.Configs.PointAt(s.Webhook.Port, s.CA.PEM)
		if err := s.Configs.Install(ctx, s.cp.Client); err != nil {
			t.Error(err)
		}
		if err := s.waitEnforcing(ctx); err != nil {
			t.Error(err)
		}
	}()
	if err := wh.WaitReady(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	err = framework.Poll(ctx, time.Minute, func() (bool, error) {
		events, err := s.cp.Client.CoreV1().Events(releaseNS).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + policyCM})
		if err != nil {
			return false, err
		}
		for _, e := range events.Items {
			if e.Reason == wellknown.ReasonPolicyInvalid && strings.Contains(e.Message, "KAI ConfigMap guard") {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no PolicyInvalid Event naming the KAI guard on the ConfigMap: %v", err)
	}
	s.Configs.PointAt(wh.Port, s.CA.PEM)
	if err := s.Configs.Install(ctx, s.cp.Client); err != nil {
		t.Fatal(err)
	}
	err = framework.Poll(ctx, time.Minute, func() (bool, error) {
		_, err := s.cp.Client.CoreV1().Pods(enforceNS).Create(ctx, kaiPod("fraction"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "env-value-from"), nil
	})
	if err != nil {
		t.Errorf("a KAI fractional pod must be denied while the fractions are not in force: %v", err)
	}
}

// waitConfigMapGuardGone waits until a tenant may write a fraction-named
// ConfigMap again, so that later tests start without the guard.
func waitConfigMapGuardGone(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "probe-shared-gpu-0"}, Data: map[string]string{"NVIDIA_VISIBLE_DEVICES": "all"}}
	err := framework.Poll(ctx, time.Minute, func() (bool, error) {
		_, err := s.cp.Client.CoreV1().ConfigMaps(enforceNS).Create(ctx, cm, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil, nil
	})
	if err != nil {
		t.Errorf("the KAI ConfigMap guard still acts after its deletion: %v", err)
	}
}

// waitConfigMapGuard waits until the API server enforces the backstop's
// ConfigMap guard (policies take effect a moment after they are stored).
func waitConfigMapGuard(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "probe-shared-gpu-0"}, Data: map[string]string{"NVIDIA_VISIBLE_DEVICES": "all"}}
	err := framework.Poll(ctx, time.Minute, func() (bool, error) {
		_, err := s.cp.Client.CoreV1().ConfigMaps(enforceNS).Create(ctx, cm, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "only KAI Scheduler's binder"), nil
	})
	if err != nil {
		t.Fatalf("the KAI ConfigMap guard never took effect: %v", err)
	}
}

func checkKAIPods(t *testing.T, arm string) {
	t.Helper()
	ctx := context.Background()
	pods := s.cp.Client.CoreV1().Pods(enforceNS)
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	got, err := pods.Create(ctx, kaiPod("fraction"), dryRun)
	if err != nil {
		t.Fatalf("%s: a KAI-shaped fractional pod must be admitted: %v", arm, err)
	}
	if v, _ := policy.EffectiveEnv(&got.Spec.Containers[0], "NVIDIA_VISIBLE_DEVICES"); v.ValueFrom == nil || v.ValueFrom.ConfigMapKeyRef == nil {
		t.Errorf("%s: the fraction container must keep KAI's ConfigMap reference as its last entry, got %+v", arm, got.Spec.Containers[0].Env)
	}
	forged := map[string]func(p *corev1.Pod){
		"a ConfigMap of the user's own": func(p *corev1.Pod) { p.Spec.Containers[0].Env[0].ValueFrom.ConfigMapKeyRef.Name = "my-gpus" },
		"a literal all": func(p *corev1.Pod) {
			p.Spec.Containers[0].Env[0] = corev1.EnvVar{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}
		},
		"an optional reference": func(p *corev1.Pod) { p.Spec.Containers[0].Env[0].ValueFrom.ConfigMapKeyRef.Optional = new(true) },
		"another scheduler":     func(p *corev1.Pod) { p.Spec.SchedulerName = "default-scheduler" },
		"a pod created bound":   func(p *corev1.Pod) { p.Spec.NodeName = "gpu-node-1" },
		"a prefix that is not KAI's": func(p *corev1.Pod) {
			p.Annotations["runai/shared-gpu-configmap"] = "train"
			p.Spec.Containers[0].Env[0].ValueFrom.ConfigMapKeyRef.Name = "train-0"
		},
		"no fraction annotation": func(p *corev1.Pod) { delete(p.Annotations, "gpu-fraction") },
	}
	for what, forge := range forged {
		p := kaiPod("forged")
		forge(p)
		if _, err := pods.Create(ctx, p, dryRun); err == nil {
			t.Errorf("%s: a fractional pod with %s must be denied", arm, what)
		}
	}
}

// checkKAIConfigMaps: a tenant cannot write a fraction's ConfigMap, KAI's
// binder can, and other ConfigMaps are untouched by the guard.
func checkKAIConfigMaps(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	cfg := rest.CopyConfig(s.cp.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: kaiBinder, Groups: []string{"system:masters", "system:authenticated"}}
	binder, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	for _, n := range []string{"train-x7k2p9q-shared-gpu-0", "train-x7k2p9q-shared-gpu-i1", "train-x7k2p9q-shared-gpu-0-evar"} {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: n}, Data: map[string]string{"NVIDIA_VISIBLE_DEVICES": "all"}}
		if _, err := s.cp.Client.CoreV1().ConfigMaps(enforceNS).Create(ctx, cm, dryRun); err == nil {
			t.Errorf("a tenant must not write ConfigMap %s", n)
		}
		if _, err := binder.CoreV1().ConfigMaps(enforceNS).Create(ctx, cm, dryRun); err != nil {
			t.Errorf("KAI's binder must write ConfigMap %s: %v", n, err)
		}
	}
	other := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings"}, Data: map[string]string{"a": "b"}}
	if _, err := s.cp.Client.CoreV1().ConfigMaps(enforceNS).Create(ctx, other, dryRun); err != nil {
		t.Errorf("the guard must leave other ConfigMaps alone: %v", err)
	}
}
