package policy

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestCheckSensitiveHostPaths: each host path volume goes to its class, in
// the volumes' order; other volumes are not judged.
func TestCheckSensitiveHostPaths(t *testing.T) {
	p := hostPathPod("/etc/ssl", false, ctr("a"))
	p.Spec.Volumes = append(p.Spec.Volumes,
		corev1.Volume{Name: "dev", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/dev"}}},
		corev1.Volume{Name: "proc", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/proc/self/root"}}})
	in := inputOf(t, nil, Request{Object: p})
	got := foundOf(checkSensitiveHostPaths(in))
	want := []string{"spec.volumes[1].hostPath.path", "spec.volumes[2].hostPath.path", "spec.volumes[3].hostPath.path"}
	if len(got) != len(want) {
		t.Fatalf("findings %+v", got)
	}
	for i, f := range got {
		if f.rule != RuleSensitiveHostPath || f.path != want[i] {
			t.Errorf("finding %d: %+v, want one at %s", i, f, want[i])
		}
	}
	if got[0].container != "a" || got[1].container != "" {
		t.Errorf("write-protected is judged per container, /dev for the pod: %+v", got)
	}
}
