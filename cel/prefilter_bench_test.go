package cel_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/admission"

	"github.com/gpuguard/gpuguard/cel"
	"github.com/gpuguard/gpuguard/cel/celeval"
	"github.com/gpuguard/gpuguard/config"
)

// BenchmarkPrefilter evaluates the pre-filter, as the API server's match
// condition code does, on the benchmark's pod after the backstop's
// injection (an init container and a plain container with void, a GPU
// container, each with the service account token mount the API server adds):
// the work every ordinary pod costs each webhook and policy.
func BenchmarkPrefilter(b *testing.B) {
	expr, err := cel.Prefilter(config.Default())
	if err != nil {
		b.Fatal(err)
	}
	b.Run("prefilter", func(b *testing.B) { benchCondition(b, expr, 0, true) })
	// Containers that also carry a dozen ordinary variables, as most do.
	b.Run("prefilter-12-env", func(b *testing.B) { benchCondition(b, expr, 12, true) })
	// The same request through a condition that reads the pod's name only:
	// what any match condition costs.
	b.Run("reference", func(b *testing.B) { benchCondition(b, `object.metadata.name == "other"`, 0, true) })
	// The MutatingAdmissionPolicy's condition, on the pod before the
	// injection, against the whole pre-filter there.
	policies, err := cel.Render(config.Default(), cel.Options{})
	if err != nil {
		b.Fatal(err)
	}
	conds := policies.Mutating.Spec.MatchConditions
	i := slices.IndexFunc(conds, func(c admissionregistrationv1.MatchCondition) bool { return c.Name == cel.InjectionPrefilterName })
	if i < 0 {
		b.Fatalf("the MutatingAdmissionPolicy has no condition %s", cel.InjectionPrefilterName)
	}
	b.Run("injection-before-void", func(b *testing.B) { benchCondition(b, conds[i].Expression, 12, false) })
	b.Run("prefilter-before-void", func(b *testing.B) { benchCondition(b, expr, 12, false) })
}

// benchCondition evaluates a condition on the benchmark's pod, with or
// without the void entries; it must hold exactly where they are missing.
func benchCondition(b *testing.B, expr string, extraEnv int, injected bool) {
	cond, err := celeval.NewCondition(admissionregistrationv1.MatchCondition{Name: cel.PrefilterName, Expression: expr})
	if err != nil {
		b.Fatal(err)
	}
	var void []corev1.EnvVar
	for i := range extraEnv {
		void = append(void, corev1.EnvVar{Name: fmt.Sprintf("APP_SETTING_%d", i), Value: "x"})
	}
	if injected {
		void = append(void, corev1.EnvVar{Name: "NVIDIA_VISIBLE_DEVICES", Value: "void"})
	}
	// What the API server's ServiceAccount admission adds before any
	// policy sees the pod: a projected token volume, mounted in every
	// container.
	token := []corev1.VolumeMount{{Name: "kube-api-access-x7k2p", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "bench", Namespace: "team"}, Spec: corev1.PodSpec{
		Volumes:        []corev1.Volume{{Name: "kube-api-access-x7k2p", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{}}}},
		InitContainers: []corev1.Container{{Name: "init", Image: "busybox", Env: void, VolumeMounts: token}},
		Containers: []corev1.Container{{Name: "app", Image: "busybox", Env: void, VolumeMounts: token}, {Name: "train", Image: "cuda", VolumeMounts: token,
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}}}}}
	req := celeval.Request{Operation: admission.Create, Namespace: "team", Object: pod}
	ctx := context.Background()
	for b.Loop() {
		ok, err := cond.Holds(ctx, req)
		if err != nil || ok == injected {
			b.Fatalf("the condition gives (%v, %v) for an ordinary pod with void injected %v", ok, err, injected)
		}
	}
}
