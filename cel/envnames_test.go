package cel_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apiserver/pkg/admission"

	"github.com/gpuguard/gpuguard/cel/celeval"
	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/policy"
)

// TestEnvTriggersReadOnlyTheirNames holds each rule's env trigger to the
// names it lists (EnvNames), which the pre-filter's env pass relies on to
// skip other entries: over entries named otherwise, whatever their value and
// container, the trigger never holds; over its own names, some entry makes it
// hold, so that the test is not vacuous.
func TestEnvTriggersReadOnlyTheirNames(t *testing.T) {
	p := config.Default()
	in := &policy.CELInput{Policy: p, DeviceVars: p.Spec.DeviceVariables(), Protected: p.Spec.ProtectedNames(),
		IsGPU: `has(c.resources) && has(c.resources.limits) && "nvidia.com/gpu" in c.resources.limits`}
	others := []string{"CUDA_VISIBLE_DEVICES", "nvidia_visible_devices", "NVIDIA_VISIBLE_DEVICES_X", "XNVIDIA_VISIBLE_DEVICES",
		"NVIDIA_", "NVIDIA_DRIVER_CAPABILITIES ", "PATH"}
	values := []corev1.EnvVar{{Value: "all"}, {Value: "void"}, {Value: ""}, {Value: "0,1"}, {Value: "compute,utility,all"},
		{ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{Key: "k"}}}}
	checked := 0
	for _, r := range policy.Registry() {
		if r.Trigger == nil {
			continue
		}
		tr := r.Trigger(in)
		if tr == nil || tr.Env == "" {
			continue
		}
		if len(tr.EnvNames) == 0 {
			continue // lists none: the pre-filter tests every entry for it
		}
		checked++
		cond, err := celeval.NewCondition(admissionregistrationv1.MatchCondition{Name: "trigger",
			Expression: fmt.Sprintf("object.spec.containers.exists(c, has(c.env) && c.env.exists(e, %s))", tr.Env)})
		if err != nil {
			t.Fatalf("%s: %v", r.ID, err)
		}
		fired := false
		// Every protected name is a candidate too: a trigger may list fewer.
		names := slices.Concat(others, in.Protected, tr.EnvNames)
		slices.Sort(names)
		for _, name := range slices.Compact(names) {
			for _, v := range values {
				for _, gpu := range []bool{false, true} {
					holds := triggerHolds(t, cond, name, v, gpu)
					own := slices.Contains(tr.EnvNames, name)
					fired = fired || (own && holds)
					if holds && !own {
						t.Errorf("%s: its env trigger holds for %s=%q (GPU container: %v), a name it does not list", r.ID, name, v.Value, gpu)
					}
				}
			}
		}
		if !fired {
			t.Errorf("%s: its env trigger held for none of its own names: the test checks nothing", r.ID)
		}
	}
	if checked == 0 {
		t.Fatal("no env trigger lists its names")
	}
}

func triggerHolds(t *testing.T, cond *celeval.Condition, name string, v corev1.EnvVar, gpu bool) bool {
	t.Helper()
	v.Name = name
	c := corev1.Container{Name: "c", Image: "x", Env: []corev1.EnvVar{v}}
	if gpu {
		c.Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}
	}
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{c}}}
	holds, err := cond.Holds(context.Background(), celeval.Request{Operation: admission.Create, Namespace: "team", Object: pod})
	if err != nil {
		t.Fatal(err)
	}
	return holds
}
