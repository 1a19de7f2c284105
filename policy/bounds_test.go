package policy

import (
	"context"
	"fmt"
	"slices"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuguard/gpuguard/config"
)

// floodedPod has n NVIDIA_VISIBLE_DEVICES=all entries between two entries
// that must survive, and a privileged second container.
func floodedPod(n int) *corev1.Pod {
	env := []corev1.EnvVar{{Name: "KEEP_FIRST", Value: "1"}}
	for range n {
		env = append(env, corev1.EnvVar{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"})
	}
	env = append(env, corev1.EnvVar{Name: "KEEP_LAST", Value: "2"})
	yes := true
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "flood"}, Spec: corev1.PodSpec{Containers: []corev1.Container{
		{Name: "a", Env: env},
		{Name: "b", SecurityContext: &corev1.SecurityContext{Privileged: &yes}},
	}}}
}

func TestFindingsAreBoundedButAllCount(t *testing.T) {
	e := defaultEngine(t, nil)
	r := e.Evaluate(context.Background(), &Request{Operation: admissionv1.Create, Phase: Mutating, Object: floodedPod(5000)})
	if r.Allowed {
		t.Fatal("a pod with 5000 NVIDIA_VISIBLE_DEVICES=all entries was allowed")
	}
	if len(r.Violations) != MaxFindings {
		t.Errorf("%d violations listed, want %d", len(r.Violations), MaxFindings)
	}
	// 5000 env entries and the privileged container: all but the listed ones are counted.
	if got, want := r.OmittedViolations, 5000+1-MaxFindings; got != want {
		t.Errorf("%d violations omitted, want %d", got, want)
	}
	if want := []RuleID{RuleDeviceEnv, RulePrivileged}; !slices.Equal(r.OmittedRules, want) {
		t.Errorf("omitted rules %v, want %v", r.OmittedRules, want)
	}
	if len(r.Warnings) > MaxFindings+2 {
		t.Errorf("%d warnings", len(r.Warnings))
	}
}

func TestFewFindingsAreAllListed(t *testing.T) {
	r := defaultEngine(t, nil).Evaluate(context.Background(), &Request{Operation: admissionv1.Create, Phase: Mutating, Object: floodedPod(MaxFindings - 1)})
	if len(r.Violations) != MaxFindings || r.OmittedViolations != 0 || r.OmittedRules != nil {
		t.Errorf("%d listed, %d omitted %v; want all %d listed", len(r.Violations), r.OmittedViolations, r.OmittedRules, MaxFindings)
	}
}

// TestStripManyEntries: past maxPatchRemovals the patch replaces the list,
// and gives the same env as one removal per entry would.
func TestStripManyEntries(t *testing.T) {
	e := defaultEngine(t, func(s *config.PolicySpec) { s.Action = config.ActionStrip })
	for _, n := range []int{maxPatchRemovals, maxPatchRemovals + 1, 5000} {
		pod := floodedPod(n)
		pod.Spec.Containers = pod.Spec.Containers[:1]
		r := e.Evaluate(context.Background(), &Request{Operation: admissionv1.Create, Phase: Mutating, Object: pod})
		if !r.Allowed {
			t.Fatalf("%d entries: denied in strip mode: %v", n, r.Violations)
		}
		// The env replaced, void included; then the annotation naming it.
		if n > maxPatchRemovals && (len(r.Patch) != 2 || r.Patch[0].Operation != "replace") {
			t.Errorf("%d entries: %d patch operations, want the list replaced", n, len(r.Patch))
		}
		patched, err := ApplyPatch(pod, r.Patch)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, v := range patched.(*corev1.Pod).Spec.Containers[0].Env {
			got = append(got, v.Name+"="+v.Value)
		}
		if want := []string{"KEEP_FIRST=1", "KEEP_LAST=2", "NVIDIA_VISIBLE_DEVICES=void"}; !slices.Equal(got, want) {
			t.Errorf("%d entries: env after the patch %v, want %v", n, got, want)
		}
		if len(r.Warnings) > MaxFindings+1 {
			t.Errorf("%d entries: %d warnings", n, len(r.Warnings))
		}
		if last := r.Warnings[len(r.Warnings)-1]; n > MaxFindings && (last.Rule != RuleDeviceEnv || last.Message != fmt.Sprintf("removed %d more entries like those above", n-MaxFindings)) {
			t.Errorf("%d entries: last warning %q", n, r.Warnings[len(r.Warnings)-1])
		}
	}
}
