package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpuguard/gpuguard/config"
)

func auditPod(ns, name string, env ...corev1.EnvVar) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:   corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04", Env: env}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning}}
}

// auditCluster is a cluster with gpuguard's policy ConfigMap and pods and
// controllers from before its install.
func auditCluster() []runtime.Object {
	void := corev1.EnvVar{Name: "NVIDIA_VISIBLE_DEVICES", Value: "void"}
	all := corev1.EnvVar{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}
	gpu := auditPod("team-a", "train", all)
	gpu.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}
	finished := auditPod("team-a", "done")
	finished.Status.Phase = corev1.PodSucceeded
	deploy := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "miner", UID: "d1"},
		Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{Spec: auditPod("", "", all).Spec}}}
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "miner-abc",
		OwnerReferences: []metav1.OwnerReference{{Kind: "Deployment", Name: "miner", UID: "d1", Controller: new(true)}}},
		Spec: appsv1.ReplicaSetSpec{Template: corev1.PodTemplateSpec{Spec: auditPod("", "", all).Spec}}}
	return []runtime.Object{
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "gpuguard", Name: "gpuguard-policy"},
			Data: map[string]string{config.ConfigMapKey: string(config.DefaultYAML())}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "gpuguard"}},
		auditPod("team-a", "before-install"), // no void: what admission would have injected
		auditPod("team-a", "notebook", void),
		gpu, finished, deploy, rs,
		auditPod("gpuguard", "webhook"),    // the policy's namespace, unguarded
		auditPod("kube-system", "coredns"), // excluded by default
	}
}

func TestAuditJudgesWhatExists(t *testing.T) {
	o := &auditOptions{allNamespaces: true, out: outputOptions{format: "json"}, policyConfigMap: "gpuguard/gpuguard-policy",
		excluded: []string{"kube-system", "kube-node-lease"}, stderr: &bytes.Buffer{}}
	var out bytes.Buffer
	err := o.audit(context.Background(), fake.NewClientset(auditCluster()...), &out)
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != exitDenied {
		t.Fatalf("want the denied exit status, got %v", err)
	}
	var results []checkedObject
	if err := json.Unmarshal(out.Bytes(), &results); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	got := map[string][]string{}
	for _, r := range results {
		var rules []string
		for _, v := range r.Violations {
			rules = append(rules, string(v.Rule))
		}
		if len(r.Patch) > 0 {
			t.Errorf("%s %s: an existing object is judged as stored, not patched: %v", r.Kind, r.Name, r.Patch)
		}
		got[r.Kind+"/"+r.Namespace+"/"+r.Name] = rules
	}
	want := map[string][]string{
		"Pod/team-a/before-install": {"final-state"},
		"Pod/team-a/notebook":       nil,
		"Pod/team-a/train":          {"device-env"},
		"Deployment/team-a/miner":   {"device-env"},
	}
	if len(got) != len(want) {
		t.Errorf("judged %v, want exactly %v", got, want)
	}
	for k, rules := range want {
		if g, ok := got[k]; !ok || !slices.Equal(g, rules) {
			t.Errorf("%s: violations %v (judged %v), want %v", k, g, ok, rules)
		}
	}
	skipped := o.stderr.(*bytes.Buffer).String()
	for _, s := range []string{"Pod team-a/done: finished", "ReplicaSet team-a/miner-abc: owned by Deployment miner"} {
		if !strings.Contains(skipped, s) {
			t.Errorf("stderr does not say %q was left out:\n%s", s, skipped)
		}
	}
}

func TestAuditErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		o    auditOptions
		want string
	}{
		{"no policy", auditOptions{allNamespaces: true, out: outputOptions{format: "text"}, policyConfigMap: "elsewhere/gpuguard-policy"}, "policy ConfigMap elsewhere/gpuguard-policy not found"},
		{"bad reference", auditOptions{allNamespaces: true, out: outputOptions{format: "text"}, policyConfigMap: "gpuguard-policy"}, "want NAMESPACE/NAME"},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.o.stderr = &bytes.Buffer{}
			err := c.o.audit(context.Background(), fake.NewClientset(auditCluster()...), &bytes.Buffer{})
			var ee *exitError
			if !errors.As(err, &ee) || ee.code != exitUsage || !strings.Contains(ee.msg, c.want) {
				t.Errorf("got %v, want a usage error saying %q", err, c.want)
			}
		})
	}
	for _, args := range [][]string{{"audit"}, {"audit", "-A", "-n", "x"}, {"audit", "-A", "-o", "yaml"}} {
		var stderr bytes.Buffer
		if code := Run(context.Background(), args, nil, &bytes.Buffer{}, &stderr); code != exitUsage {
			t.Errorf("%v: exit %d, want %d (%s)", args, code, exitUsage, stderr.String())
		}
	}
}

// TestAuditPreviewsACandidatePolicy: --policy judges the live cluster with a
// policy file instead of the ConfigMap, before it is applied: here a
// candidate that exempts team-a admits what the live policy denies.
func TestAuditPreviewsACandidatePolicy(t *testing.T) {
	candidate := filepath.Join(t.TempDir(), "candidate.yaml")
	doc := "apiVersion: gpuguard.io/v1alpha1\nkind: GPUGuardPolicy\nmetadata: {name: candidate}\nspec:\n  exemptions:\n    namespaces: [team-a]\n"
	if err := os.WriteFile(candidate, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	o := &auditOptions{allNamespaces: true, out: outputOptions{format: "json"}, policyConfigMap: "gpuguard/gpuguard-policy",
		policyFile: candidate, excluded: []string{"kube-system", "kube-node-lease"}, stderr: &bytes.Buffer{}}
	var out bytes.Buffer
	if err := o.audit(context.Background(), fake.NewClientset(auditCluster()...), &out); err != nil {
		t.Fatalf("with team-a exempt, nothing should be denied: %v\n%s", err, out.String())
	}
	o.policyFile = filepath.Join(t.TempDir(), "missing.yaml")
	var ee *exitError
	if err := o.audit(context.Background(), fake.NewClientset(auditCluster()...), &bytes.Buffer{}); !errors.As(err, &ee) || ee.code != exitUsage || !strings.Contains(ee.msg, "--policy") {
		t.Errorf("a missing candidate policy: %v, want a usage error naming --policy", err)
	}
}
