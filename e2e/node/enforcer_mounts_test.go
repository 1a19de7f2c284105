//go:build e2e

package node

import (
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// withHostPath mounts host path hostPath at /mnt/host in p's container.
func withHostPath(p *corev1.Pod, hostPath string, readOnly bool) *corev1.Pod {
	p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "host",
		VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: hostPath}}})
	c := &p.Spec.Containers[0]
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "host", MountPath: "/mnt/host", ReadOnly: readOnly})
	return p
}

// testEnforcedPlantedLink is the two-pod form of a planted link, which
// admission cannot see: a root pod that may write a host directory no
// policy list names plants a link there (here a setup step on the host
// does it for the pod), and a later pod mounts the link's path, which reads
// as an ordinary directory. containerd resolves the link when it builds the
// spec; the enforcer reads the pod's hostPath, resolves it as the runtime
// does, and refuses the container, naming the mount, the name and where it
// leads. The target is /dev, the device nodes, sensitive in the default
// policy on every host (the suite's containerd keeps its socket under the
// node's own root, which the policy does not name). A neighbour mounting a
// plain directory beside the link, read-write, and a one-GPU pod start.
func testEnforcedPlantedLink(t *testing.T) {
	logEnforcerOnFailure(t)
	dir, err := os.MkdirTemp("", "gpuguard-planted-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	link, plain := filepath.Join(dir, "link"), filepath.Join(dir, "plain")
	if err := os.Mkdir(plain, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev", link); err != nil {
		t.Fatal(err)
	}
	expectCreateContainerError(t, withHostPath(probePod("enforced-planted-link"), link, true),
		"names the host path "+link+", which the node resolves through the link "+link+" to /dev, the sensitive path /dev")
	probe(t, tenantNS, withHostPath(probePod("enforced-plain-host-dir"), plain, false))
	report, pod := probe(t, tenantNS, gpuPod("enforced-link-neighbour-gpu"))
	expectAllocatedOnly(t, report, pod)
}
