package policy

import (
	"context"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuguard/gpuguard/internal/wellknown"
)

// TestVoidAnnotationNamesTheVoidedContainers: a new pod that inject-void
// patches carries wellknown.VoidAnnotation naming exactly the containers that
// got void, whatever annotations it came with; nothing else gets it.
func TestVoidAnnotationNamesTheVoidedContainers(t *testing.T) {
	gpu := corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}
	void := []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "void"}}
	pod := func(annotations map[string]string, cs ...corev1.Container) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Annotations: annotations},
			Spec: corev1.PodSpec{InitContainers: cs[:1], Containers: cs[1:]}}
	}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		op   admissionv1.Operation
		want string // "" for no annotation
	}{
		{"every plain container, in spec order", pod(nil, corev1.Container{Name: "init"}, corev1.Container{Name: "train", Resources: gpu}, corev1.Container{Name: "sidecar"}),
			admissionv1.Create, "init,sidecar"},
		{"beside the pod's own annotations", pod(map[string]string{"team": "ml", "a/b": "c"}, corev1.Container{Name: "init", Env: void}, corev1.Container{Name: "notebook"}),
			admissionv1.Create, "notebook"},
		{"a false claim replaced", pod(map[string]string{wellknown.VoidAnnotation: "nothing"}, corev1.Container{Name: "init"}, corev1.Container{Name: "app", Env: void}),
			admissionv1.Create, "init"},
		{"nothing voided", pod(nil, corev1.Container{Name: "init", Env: void}, corev1.Container{Name: "train", Resources: gpu}),
			admissionv1.Create, ""},
		{"not on an update", pod(nil, corev1.Container{Name: "init"}, corev1.Container{Name: "app"}),
			admissionv1.Update, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := defaultEngine(t, nil).Evaluate(context.Background(), &Request{Operation: tc.op, Phase: Mutating, Object: tc.pod})
			if !r.Allowed {
				t.Fatalf("denied: %v", r.Violations)
			}
			patched, err := ApplyPatch(tc.pod, r.Patch)
			if err != nil {
				t.Fatal(err)
			}
			meta := patched.(*corev1.Pod).ObjectMeta
			got, ok := meta.Annotations[wellknown.VoidAnnotation]
			switch {
			case tc.want == "" && ok && tc.pod.Annotations[wellknown.VoidAnnotation] != got:
				t.Errorf("annotated %q, want none", got)
			case tc.want != "" && got != tc.want:
				t.Errorf("annotated %q, want %q", got, tc.want)
			}
			for k, v := range tc.pod.Annotations {
				if k != wellknown.VoidAnnotation && meta.Annotations[k] != v {
					t.Errorf("annotation %s=%q lost: %q", k, v, meta.Annotations[k])
				}
			}
		})
	}
}
