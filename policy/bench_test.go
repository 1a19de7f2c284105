package policy_test

import (
	"context"
	"fmt"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/policy"
)

// typicalPod is a training pod: an init container that fetches data, a GPU
// container, and a logging sidecar, with the env, mounts and volumes such pods carry.
func typicalPod() *corev1.Pod {
	env := []corev1.EnvVar{{Name: "LOG_LEVEL", Value: "info"}, {Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{
		FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}
	mounts := []corev1.VolumeMount{{Name: "data", MountPath: "/data"}, {Name: "cache", MountPath: "/root/.cache"}}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: "ml", Annotations: map[string]string{"team": "vision"}},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: "fetch", Image: "busybox", Env: env, VolumeMounts: mounts}},
			Containers: []corev1.Container{
				{Name: "trainer", Image: "nvcr.io/nvidia/pytorch:24.05-py3", Env: env, VolumeMounts: mounts,
					Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}},
				{Name: "logs", Image: "fluent-bit", Env: env, VolumeMounts: mounts},
			},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				{Name: "cache", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
		},
	}
}

// widePod has n containers, every fifth one with a GPU.
func widePod(n int) *corev1.Pod {
	pod := typicalPod()
	pod.Spec.Containers = nil
	for i := range n {
		c := corev1.Container{Name: fmt.Sprintf("c%d", i), Image: "busybox",
			Env: []corev1.EnvVar{{Name: "INDEX", Value: fmt.Sprint(i)}}}
		if i%5 == 0 {
			c.Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}
		}
		pod.Spec.Containers = append(pod.Spec.Containers, c)
	}
	return pod
}

func BenchmarkEvaluate(b *testing.B) {
	e, err := policy.New(config.Default())
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
	}{{"typical-3-containers", typicalPod()}, {"50-containers", widePod(50)}} {
		for _, phase := range []policy.Phase{policy.Mutating, policy.Validating} {
			b.Run(tc.name+"/"+string(phase), func(b *testing.B) {
				req := &policy.Request{Operation: admissionv1.Create, Object: tc.pod, Phase: phase}
				if phase == policy.Validating {
					// The validating phase sees the object after the mutating one.
					req.Object = mutated(b, e, tc.pod)
				}
				b.ReportAllocs()
				for b.Loop() {
					if r := e.Evaluate(ctx, req); !r.Allowed {
						b.Fatalf("denied: %+v", r.Violations)
					}
				}
			})
		}
	}
}

func mutated(b *testing.B, e *policy.Engine, pod *corev1.Pod) *corev1.Pod {
	r := e.Evaluate(context.Background(), &policy.Request{Operation: admissionv1.Create, Object: pod, Phase: policy.Mutating})
	obj, err := policy.ApplyPatch(pod, r.Patch)
	if err != nil {
		b.Fatal(err)
	}
	return obj.(*corev1.Pod)
}
