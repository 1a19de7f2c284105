//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuguard/gpuguard/e2e/framework/controlplane"
)

// auditedObject is the part of check's JSON contract the test reads.
type auditedObject struct {
	Kind, Namespace, Name string
	Allowed               bool
	Violations            []struct{ Rule string }
}

// TestAuditFindsWhatCameBefore creates, with gpuguard's webhooks removed, what
// a cluster holds from before its install (a CUDA-style pod without void, a
// compliant pod, a Deployment asking for every GPU), then runs `gpuguard
// audit` against the real API server with the suite's live policy.
func TestAuditFindsWhatCameBefore(t *testing.T) {
	ctx := context.Background()
	ns := "audit-before"
	if err := controlplane.EnsureNamespace(ctx, s.cp, ns, nil); err != nil {
		t.Fatal(err)
	}
	leak := plainPod("leak")
	compliant := withEnv(plainPod("compliant"), corev1.EnvVar{Name: "NVIDIA_VISIBLE_DEVICES", Value: "void"})
	deploy := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "miner"}, Spec: appsv1.DeploymentSpec{
		Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "miner"}},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "miner"}},
			Spec: withEnv(plainPod("x"), allGPUs).Spec}}}
	created := map[string]bool{}
	createBeforeInstall(t, func() bool {
		for _, p := range []*corev1.Pod{leak, compliant} {
			if !created[p.Name] {
				if _, err := s.cp.Client.CoreV1().Pods(ns).Create(ctx, p.DeepCopy(), metav1.CreateOptions{}); err != nil {
					return false
				}
				created[p.Name] = true
			}
		}
		if !created["miner"] {
			if _, err := s.cp.Client.AppsV1().Deployments(ns).Create(ctx, deploy, metav1.CreateOptions{}); err != nil {
				return false
			}
			created["miner"] = true
		}
		return true
	})
	stored, err := s.cp.Client.CoreV1().Pods(ns).Get(ctx, "leak", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := lastEnv(stored.Spec.Containers[0], "NVIDIA_VISIBLE_DEVICES"); got == "void" {
		t.Fatal("the pod from before the install got void: the webhooks were not removed")
	}

	results, code := runAudit(t, "-n", ns)
	if code != 1 {
		t.Errorf("audit exit status %d, want 1 (something is denied)", code)
	}
	got := map[string][]string{}
	for _, r := range results {
		var rules []string
		for _, v := range r.Violations {
			rules = append(rules, v.Rule)
		}
		got[r.Kind+"/"+r.Name] = rules
	}
	want := map[string][]string{"Pod/leak": {"final-state"}, "Pod/compliant": nil, "Deployment/miner": {"device-env"}}
	for k, rules := range want {
		if g, ok := got[k]; !ok || !slices.Equal(g, rules) {
			t.Errorf("%s: violations %v (in the audit: %v), want %v; whole audit %v", k, g, ok, rules, got)
		}
	}
}

// runAudit runs the built binary's audit with the suite's policy ConfigMap.
func runAudit(t *testing.T, args ...string) ([]auditedObject, int) {
	t.Helper()
	kubeconfig, err := s.cp.Kubeconfig("gpuguard-audit")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(s.Binary, append([]string{"audit", "--kubeconfig", kubeconfig, "-o", "json",
		"--policy-configmap", releaseNS + "/" + policyName}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	var out []auditedObject
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("audit output is not check's JSON (exit %d): %v\n%s\n%s", code, err, stdout.String(), stderr.String())
	}
	return out, code
}
