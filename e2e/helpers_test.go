//go:build e2e

package e2e

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpuguard/gpuguard/e2e/framework"
	"github.com/gpuguard/gpuguard/internal/warnings"
)

const cudaImage = "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04"

func plainPod(name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: cudaImage}}}}
}

func withEnv(p *corev1.Pod, env ...corev1.EnvVar) *corev1.Pod {
	p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, env...)
	return p
}

func gpuContainer(name string) corev1.Container {
	q := resource.MustParse("1")
	return corev1.Container{Name: name, Image: cudaImage, Resources: corev1.ResourceRequirements{
		Limits: corev1.ResourceList{"nvidia.com/gpu": q}, Requests: corev1.ResourceList{"nvidia.com/gpu": q}}}
}

var allGPUs = corev1.EnvVar{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}

// lastEnv is a variable's effective value: the last entry wins.
func lastEnv(c corev1.Container, name string) string { return framework.LastEnv(c, name) }

// deniedRules returns the rules named in a gpuguard denial, or fails the test when
// err is not one.
func deniedRules(t *testing.T, err error) []string {
	t.Helper()
	rules, err := framework.DeniedRules(err)
	if err != nil {
		t.Fatal(err)
	}
	return rules
}

func expectDenied(t *testing.T, err error, rules ...string) {
	t.Helper()
	got := deniedRules(t, err)
	for _, r := range rules {
		if !slices.Contains(got, r) {
			t.Errorf("denial names rules %v, want %s among them: %v", got, r, err)
		}
	}
}

// clientWithWarnings is a client whose admission warnings are collected.
func clientWithWarnings(t *testing.T) (kubernetes.Interface, *warnings.Collector) {
	t.Helper()
	w := &warnings.Collector{}
	cfg := rest.CopyConfig(s.cp.Config)
	cfg.WarningHandler = w
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c, w
}

func deletePod(ctx context.Context, ns, name string) {
	zero := int64(0)
	_ = s.cp.Client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
}
