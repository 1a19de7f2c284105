//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuguard/gpuguard/e2e/framework"
)

func TestPodsAreStoredWithVoid(t *testing.T) {
	ctx := context.Background()
	p := plainPod("mixed")
	p.Spec.InitContainers = []corev1.Container{{Name: "fetch", Image: "busybox"}}
	p.Spec.Containers = append(p.Spec.Containers, gpuContainer("train"))
	stored, err := s.cp.Client.CoreV1().Pods(enforceNS).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer deletePod(ctx, enforceNS, p.Name)
	for _, c := range []corev1.Container{stored.Spec.InitContainers[0], stored.Spec.Containers[0]} {
		if got := lastEnv(c, "NVIDIA_VISIBLE_DEVICES"); got != "void" {
			t.Errorf("container %s stored with NVIDIA_VISIBLE_DEVICES=%s, want void", c.Name, got)
		}
	}
	if env := stored.Spec.Containers[1].Env; len(env) != 0 {
		t.Errorf("the GPU container must be stored untouched, got env %v", env)
	}
}

func TestExemptServiceAccountUntouched(t *testing.T) {
	ctx := context.Background()
	p := withEnv(plainPod("device-plugin"), allGPUs)
	p.Spec.ServiceAccountName = "nvidia-device-plugin"
	stored, err := s.cp.Client.CoreV1().Pods(operatorNS).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("an exempt namespace + service account must pass: %v", err)
	}
	defer deletePod(ctx, operatorNS, p.Name)
	if got := stored.Spec.Containers[0].Env; len(got) != 1 || got[0] != allGPUs {
		t.Errorf("an exempt pod must be stored untouched, got env %v", got)
	}
	// The same pod with another service account in that namespace is not exempt.
	p.Name, p.Spec.ServiceAccountName = "impostor", "default"
	_, err = s.cp.Client.CoreV1().Pods(operatorNS).Create(ctx, p, metav1.CreateOptions{})
	expectDenied(t, err, "device-env")
}

func TestWarnNamespaceReturnsWarnings(t *testing.T) {
	ctx := context.Background()
	c, w := clientWithWarnings(t)
	p := withEnv(plainPod("warned"), allGPUs)
	if _, err := c.CoreV1().Pods(warnNS).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("a warn namespace must allow: %v", err)
	}
	defer deletePod(ctx, warnNS, p.Name)
	if got := strings.Join(w.All(), "\n"); !strings.Contains(got, "gpuguard device-env: spec.containers[0].env") {
		t.Errorf("the client must receive gpuguard's warning, got %q", got)
	}
}

func TestAuditNamespaceRecordsAnnotations(t *testing.T) {
	ctx := context.Background()
	p := withEnv(plainPod("audited"), allGPUs)
	if _, err := s.cp.Client.CoreV1().Pods(auditNS).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("an audit namespace must allow: %v", err)
	}
	defer deletePod(ctx, auditNS, p.Name)
	err := framework.Poll(ctx, 30*time.Second, func() (bool, error) {
		return auditLogHas(`"name":"audited"`, `"validate.pods.gpuguard.io/device-env"`), nil
	})
	if err != nil {
		t.Errorf("no audit event for the pod with the annotation validate.pods.gpuguard.io/device-env: %v", err)
	}
}

// auditLogHas reports whether one audit event contains every fragment.
func auditLogHas(fragments ...string) bool {
	f, err := os.Open(s.cp.AuditLog)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<22)
	for sc.Scan() {
		line := sc.Text()
		all := true
		for _, frag := range fragments {
			all = all && strings.Contains(line, frag)
		}
		if all {
			return true
		}
	}
	return false
}

func TestFinalStateWithoutTheMutatingWebhook(t *testing.T) {
	ctx := context.Background()
	if err := s.Configs.RemoveMutating(ctx, s.cp.Client); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := s.Configs.InstallMutating(ctx, s.cp.Client); err != nil {
			t.Fatal(err)
		}
		if err := s.waitEnforcing(ctx); err != nil {
			t.Fatal(err)
		}
	}()
	// The API server may still call the old configuration for a moment: wait until
	// a plain pod is judged without mutation.
	var err error
	waitErr := framework.Poll(ctx, 30*time.Second, func() (bool, error) {
		_, err = s.cp.Client.CoreV1().Pods(enforceNS).Create(ctx, plainPod("unmutated"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil, nil
	})
	if waitErr != nil {
		t.Fatal("a non-GPU pod was admitted without void while the mutating webhook was gone")
	}
	expectDenied(t, err, "final-state")
}

func TestEphemeralContainers(t *testing.T) {
	ctx := context.Background()
	pods := s.cp.Client.CoreV1().Pods(enforceNS)
	running, err := pods.Create(ctx, plainPod("debug-me"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer deletePod(ctx, enforceNS, running.Name)
	debug := corev1.EphemeralContainer{EphemeralContainerCommon: corev1.EphemeralContainerCommon{
		Name: "debugger", Image: cudaImage, Env: []corev1.EnvVar{allGPUs}}}
	bad := running.DeepCopy()
	bad.Spec.EphemeralContainers = []corev1.EphemeralContainer{debug}
	_, err = pods.UpdateEphemeralContainers(ctx, bad.Name, bad, metav1.UpdateOptions{})
	expectDenied(t, err, "device-env")

	debug.Env = nil
	good := running.DeepCopy()
	good.Spec.EphemeralContainers = []corev1.EphemeralContainer{debug}
	stored, err := pods.UpdateEphemeralContainers(ctx, good.Name, good, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("a clean ephemeral container must be added: %v", err)
	}
	if got := lastEnv(corev1.Container(stored.Spec.EphemeralContainers[0].EphemeralContainerCommon), "NVIDIA_VISIBLE_DEVICES"); got != "void" {
		t.Errorf("the ephemeral container was stored with NVIDIA_VISIBLE_DEVICES=%s, want void", got)
	}
}

func TestAnnotationAddedToARunningPod(t *testing.T) {
	ctx := context.Background()
	pods := s.cp.Client.CoreV1().Pods(enforceNS)
	if _, err := pods.Create(ctx, plainPod("annotate-me"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer deletePod(ctx, enforceNS, "annotate-me")
	patch := []byte(`{"metadata":{"annotations":{"nvidia.cdi.k8s.io/container.app":"nvidia.com/gpu=all"}}}`)
	_, err := pods.Patch(ctx, "annotate-me", types.MergePatchType, patch, metav1.PatchOptions{})
	expectDenied(t, err, "device-annotation")
	if _, err := pods.Patch(ctx, "annotate-me", types.MergePatchType, []byte(`{"metadata":{"annotations":{"team":"vision"}}}`), metav1.PatchOptions{}); err != nil {
		t.Errorf("an ordinary annotation must be allowed: %v", err)
	}
}

func deploymentOf(name string, p *corev1.Pod) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: appsv1.DeploymentSpec{
		Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: p.Spec}}}
}

func TestControllers(t *testing.T) {
	ctx := context.Background()
	leak := withEnv(plainPod("x"), allGPUs)
	_, err := s.cp.Client.AppsV1().Deployments(enforceNS).Create(ctx, deploymentOf("leaky", leak), metav1.CreateOptions{})
	expectDenied(t, err, "device-env")

	cron := &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Name: "nightly"}, Spec: batchv1.CronJobSpec{Schedule: "0 3 * * *",
		JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: leak.Spec}}}}}
	cron.Spec.JobTemplate.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyNever
	_, err = s.cp.Client.BatchV1().CronJobs(enforceNS).Create(ctx, cron, metav1.CreateOptions{})
	expectDenied(t, err, "device-env")
}

// TestOldViolatingDeployment: a Deployment admitted before enforcement (here: while
// its namespace was in warn mode) can still be scaled and deleted.
func TestOldViolatingDeployment(t *testing.T) {
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-legacy", Labels: map[string]string{"gpuguard.io/mode": "warn"}}}
	if _, err := s.cp.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deployments := s.cp.Client.AppsV1().Deployments(ns.Name)
	if _, err := deployments.Create(ctx, deploymentOf("legacy", withEnv(plainPod("x"), allGPUs)), metav1.CreateOptions{}); err != nil {
		t.Fatalf("warn mode must admit the Deployment: %v", err)
	}
	ns.Labels = nil
	if _, err := s.cp.Client.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Wait until the namespace enforces: a change to the template is denied.
	var err error
	waitErr := framework.Poll(ctx, 30*time.Second, func() (bool, error) {
		_, err = deployments.Patch(ctx, "legacy", types.MergePatchType,
			[]byte(`{"spec":{"template":{"metadata":{"labels":{"rev":"2"}}}}}`), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil, nil
	})
	if waitErr != nil {
		t.Fatal("a template change of the violating Deployment was never denied after enforcement")
	}
	expectDenied(t, err, "device-env")
	if _, err := deployments.Patch(ctx, "legacy", types.MergePatchType, []byte(`{"spec":{"replicas":3}}`), metav1.PatchOptions{}); err != nil {
		t.Errorf("scaling an old Deployment must keep working: %v", err)
	}
	if err := deployments.Delete(ctx, "legacy", metav1.DeleteOptions{}); err != nil {
		t.Errorf("deleting an old Deployment must keep working: %v", err)
	}
}

func TestDryRunBehavesLikeARealCreate(t *testing.T) {
	ctx := context.Background()
	pods := s.cp.Client.CoreV1().Pods(enforceNS)
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	_, err := pods.Create(ctx, withEnv(plainPod("dry-leak"), allGPUs), dry)
	expectDenied(t, err, "device-env")
	stored, err := pods.Create(ctx, plainPod("dry-plain"), dry)
	if err != nil {
		t.Fatal(err)
	}
	if got := lastEnv(stored.Spec.Containers[0], "NVIDIA_VISIBLE_DEVICES"); got != "void" {
		t.Errorf("dry-run result has NVIDIA_VISIBLE_DEVICES=%s, want void", got)
	}
	if _, err := pods.Get(ctx, "dry-plain", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a dry run must persist nothing, got %v", err)
	}
}
