package policy

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestKAIGPUGroups: a one-GPU fraction's group label, and a multi-GPU
// fraction's group labels (which carry no plain group label).
func TestKAIGPUGroups(t *testing.T) {
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   []string
	}{
		{"one GPU", map[string]string{KAIGPUGroupLabel: "g1", "app": "x"}, []string{"g1"}},
		{"two GPUs", map[string]string{KAIGPUGroupLabel + "/g2": "g2", KAIGPUGroupLabel + "/g1": "g1"}, []string{"g1", "g2"}},
		{"not bound", map[string]string{"app": "x"}, nil},
	} {
		got := KAIGPUGroups(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Labels: tc.labels}})
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
