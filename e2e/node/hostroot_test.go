//go:build e2e

package node

import (
	"context"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuguard/gpuguard/e2e/framework"
	"github.com/gpuguard/gpuguard/e2e/framework/kubenode"
)

// hostRootPod is a monitoring agent shaped like kube-prometheus's node
// exporter: the host's / mounted read-only, as user 65534 without a group,
// no privilege escalation, every capability dropped. Its image, which any
// tenant could build, puts that user in root's group twice over (its
// /etc/passwd and its /etc/group). The probe tries to connect to
// containerd's socket through the mount.
func hostRootPod(prefix string) *corev1.Pod {
	p := probePod(prefix)
	nobody, yes, no := int64(65534), true, false
	p.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: &nobody, RunAsNonRoot: &yes}
	p.Spec.Volumes = []corev1.Volume{{Name: "root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}}
	c := &p.Spec.Containers[0]
	c.Image = kubenode.RootGroupProbeImage
	c.VolumeMounts = []corev1.VolumeMount{{Name: "root", MountPath: "/host", ReadOnly: true}}
	c.SecurityContext = &corev1.SecurityContext{AllowPrivilegeEscalation: &no, ReadOnlyRootFilesystem: &yes,
		Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}
	c.Env = append(c.Env, corev1.EnvVar{Name: "PROBE_CONNECT", Value: "/host" + s.node.ContainerdSocket()})
	return p
}

// testHostRootReachesRuntime is the baseline: admitted as it is, the
// container's groups hold root's, and the read-only mount does not stop it
// connecting to the runtime's root:root 0660 socket, which would let it
// start any container on the node. Setting runAsGroup alone is not enough:
// the image's /etc/group still adds root's group, unless
// supplementalGroupsPolicy is Strict.
func testHostRootReachesRuntime(t *testing.T) {
	groupOnly := hostRootPod("host-root-group-only")
	gid := int64(65534)
	groupOnly.Spec.SecurityContext.RunAsGroup = &gid
	for _, p := range []*corev1.Pod{hostRootPod("host-root"), groupOnly} {
		report, _ := probe(t, tenantNS, p)
		t.Logf("groups %v, connect: %s", report.Groups, report.Connect)
		if !slices.Contains(report.Groups, 0) || report.Connect != "ok" {
			t.Errorf("without gpuguard %s has groups %v and connect says %q; want root's group and a connection, "+
				"or this node does not show the threat", p.Name, report.Groups, report.Connect)
		}
	}
}

// testHostRootPinned: gpuguard admits the same pod with its groups pinned
// (supplementalGroupsPolicy Strict, runAsGroup 65534), the runtime honours
// them, and the socket refuses the container.
func testHostRootPinned(t *testing.T) {
	report, pod := probe(t, tenantNS, hostRootPod("host-root"))
	t.Logf("groups %v, connect: %s", report.Groups, report.Connect)
	if got := framework.PinnedGroups(pod); got != "Strict probe:65534" {
		t.Errorf("stored pod has supplementalGroupsPolicy and runAsGroup %q, want \"Strict probe:65534\" (pinned by gpuguard)", got)
	}
	if slices.Contains(report.Groups, 0) {
		t.Errorf("the container's groups %v hold root's", report.Groups)
	}
	if !strings.Contains(report.Connect, "permission denied") {
		t.Errorf("connecting to containerd's socket: %q, want permission denied", report.Connect)
	}
}

// hostPIDSidecarPod is a pod sharing the node's process namespace: an
// exporter gpuguard would admit alone (the host's / read-only as
// nobody:nogroup, groups pinned, nothing to escalate with), held running,
// and a root sidecar beside it that takes the exporter's user and group,
// keeps root's group, and connects to the runtime's socket through the
// exporter's /proc/PID/root.
func hostPIDSidecarPod(prefix string) *corev1.Pod {
	p := hostRootPod(prefix)
	gid, root, rootAllowed := int64(65534), int64(0), false
	strict := corev1.SupplementalGroupsPolicyStrict
	p.Spec.HostPID = true
	p.Spec.SecurityContext.RunAsGroup = &gid
	p.Spec.SecurityContext.SupplementalGroupsPolicy = &strict
	exporter := p.Spec.Containers[0]
	exporter.Name = "exporter"
	exporter.Env = append(exporter.Env, corev1.EnvVar{Name: "PROBE_HOLD", Value: "1"})
	sidecar := corev1.Container{Name: "sidecar", Image: kubenode.ProbeImage, ImagePullPolicy: corev1.PullNever,
		SecurityContext: &corev1.SecurityContext{RunAsUser: &root, RunAsGroup: &root, RunAsNonRoot: &rootAllowed},
		Env:             []corev1.EnvVar{{Name: "PROBE_ENTER_UID", Value: "65534"}, {Name: "PROBE_CONNECT", Value: "/host" + s.node.ContainerdSocket()}}}
	p.Spec.Containers = []corev1.Container{sidecar, exporter}
	return p
}

// testHostPIDSidecarReachesRuntime is the baseline: without gpuguard the
// root sidecar reaches the socket the exporter's pinned groups keep from
// the exporter itself.
func testHostPIDSidecarReachesRuntime(t *testing.T) {
	ctx := context.Background()
	p := hostPIDSidecarPod("hostpid-sidecar")
	report, _, err := s.node.RunProbeContainer(ctx, tenantNS, p, "sidecar")
	t.Cleanup(func() { _ = s.node.DeletePod(ctx, tenantNS, p.Name) })
	if err != nil {
		t.Fatal(err)
	}
	if report.Connect != "ok" {
		t.Errorf("without gpuguard the hostPID root sidecar's connect says %q; want a connection, or this node does not show the threat", report.Connect)
	}
}

// testHostPIDSidecarDenied: gpuguard denies the pod (namespace-entry), so
// the sidecar never runs to connect.
func testHostPIDSidecarDenied(t *testing.T) {
	expectDenied(t, create(t, tenantNS, hostPIDSidecarPod("hostpid-sidecar")), "namespace-entry")
}
