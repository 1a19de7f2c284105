package policy

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuguard/gpuguard/config"
)

// linkPod is a pod with host path volumes "a" at outer and "b" at inner:
// container "w" mounts a (read-only where outerReadOnly), container "r"
// mounts b read-only.
func linkPod(outer, inner string, outerReadOnly bool) *corev1.Pod {
	w := ctr("w")
	w.VolumeMounts = []corev1.VolumeMount{{Name: "a", MountPath: "/a", ReadOnly: outerReadOnly}}
	r := ctr("r")
	r.VolumeMounts = []corev1.VolumeMount{{Name: "b", MountPath: "/b", ReadOnly: true}}
	p := podOf(w, r)
	p.Spec.Volumes = []corev1.Volume{
		{Name: "a", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: outer}}},
		{Name: "b", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: inner}}},
	}
	return p
}

func TestCheckHostPathLinks(t *testing.T) {
	pair := func(inner, outer string) string {
		return sprintf("%q lies below %q, which container w mounts read-write: a link it plants there would lead the node's mount anywhere; "+
			"mount one volume and use subPath, or mount %q readOnly", inner, outer, outer)
	}
	root := func(p, r string) string {
		return sprintf("%q lies below the data directory %s, where a pod may have planted a link that the node follows; "+
			"mount %s itself, or name the path in the policy (writableHostPaths, writeProtectedHostPaths)", p, r, r)
	}
	b := "spec.volumes[1].hostPath.path"
	runRuleTable(t, []ruleCase{
		{name: "below a read-write mount", req: Request{Object: linkPod("/data", "/data/x", false)},
			want: []found{{RuleHostPathLink, effectDeny, "", b, pair("/data/x", "/data"), editNone}}},
		{name: "below a read-only mount", req: Request{Object: linkPod("/data", "/data/x", true)}},
		{name: "siblings", req: Request{Object: linkPod("/data", "/data2/x", false)}},
		{name: "the same path twice", req: Request{Object: linkPod("/data", "/data/", false)}},
		{name: "below the host's root", req: Request{Object: linkPod("/", "/data", false)},
			want: []found{{RuleHostPathLink, effectDeny, "", b, pair("/data", "/"), editNone}}},
		{name: "under the other name of a link", policy: func(s *config.PolicySpec) { s.RuntimeStateHostPaths = nil; s.WritableHostPaths = nil },
			req:  Request{Object: linkPod("/var/run/agent", "/run/agent/sock", false)},
			want: []found{{RuleHostPathLink, effectDeny, "", b, pair("/run/agent/sock", "/var/run/agent"), editNone}}},
		{name: "below a data directory", req: Request{Object: hostPathPod("/var/tmp/x", true, ctr("a"))},
			want: []found{{RuleHostPathLink, effectDeny, "", "spec.volumes[1].hostPath.path", root("/var/tmp/x", "/var/tmp"), editNone}}},
		{name: "a data directory itself", req: Request{Object: hostPathPod("/var/tmp", false, ctr("a"))}},
		{name: "named exactly", policy: func(s *config.PolicySpec) {
			s.WritableHostPaths = append(s.WritableHostPaths, config.WritableHostPath{Path: "/var/tmp/x"})
		},
			req: Request{Object: hostPathPod("/var/tmp/x", false, ctr("a"))}},
		{name: "named exactly under its other name", policy: func(s *config.PolicySpec) {
			s.WriteProtectedHostPaths = append(s.WriteProtectedHostPaths, "/run/promtail/db")
		},
			req: Request{Object: hostPathPod("/var/run/promtail/db", true, ctr("a"))}},
	}, checkHostPathLinks, nil)
}
