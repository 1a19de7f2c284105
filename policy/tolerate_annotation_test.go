package policy

import (
	"context"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuguard/gpuguard/internal/wellknown"
)

// TestDefaultPolicyDeniesTheEnforcerToleration: on a node whose containerd
// requires the node enforcer, a pod annotated with the toleration key
// starts while the enforcer is down, unjudged. The default policy denies
// the key to every pod it judges, in both phases.
func TestDefaultPolicyDeniesTheEnforcerToleration(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Annotations: map[string]string{wellknown.TolerateMissingEnforcerAnnotation: "true"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app"}}}}
	for _, phase := range []Phase{Mutating, Validating} {
		r := defaultEngine(t, nil).Evaluate(context.Background(), &Request{Operation: admissionv1.Create, Phase: phase, Object: pod})
		if r.Allowed {
			t.Fatalf("phase %v: a pod tolerating a missing enforcer was admitted", phase)
		}
		named := false
		for _, v := range r.Violations {
			named = named || v.Rule == RuleDeviceAnnotation && strings.Contains(v.Path, wellknown.TolerateMissingEnforcerAnnotation)
		}
		if !named {
			t.Errorf("phase %v: no device-annotation violation names the key: %+v", phase, r.Violations)
		}
	}
}
