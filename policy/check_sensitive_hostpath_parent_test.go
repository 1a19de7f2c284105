package policy

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestParentHostPath(t *testing.T) {
	grouped := unprivileged()
	grouped.RunAsGroup = ptr(int64(1000))
	strictPod := func(p *corev1.Pod) *corev1.Pod {
		strict := corev1.SupplementalGroupsPolicyStrict
		p.Spec.SecurityContext = &corev1.PodSecurityContext{SupplementalGroupsPolicy: &strict}
		return p
	}
	msg := func(path, reach, missing string) string {
		return sprintf("mounts %q, which reaches %s, without %s; such a mount needs readOnly, a non-root user and group, "+
			"allowPrivilegeEscalation: false, capabilities.drop [ALL] (adding back NET_BIND_SERVICE or SYS_TIME at most) and no privilege", path, reach, missing)
	}
	at := "spec.volumes[1].hostPath.path"
	runRuleTable(t, []ruleCase{
		{name: "every condition met", req: Request{Object: strictPod(hostPathPod("/var/lib", true, withSC(ctr("a"), grouped)))}},
		{name: "groups unknown", req: Request{Object: hostPathPod("/var/lib", true, withSC(ctr("a"), unprivileged()))},
			want: []found{{RuleSensitiveHostPath, effectDeny, "a", at,
				msg("/var/lib", "/var/lib/kubelet/device-plugins", "runAsGroup above 0, supplementalGroupsPolicy: Strict"), editNone}}},
		{name: "runtime state, root and writable, only mounting containers", req: Request{Object: func() *corev1.Pod {
			p := hostPathPod("/var/lib/k0s/run", false, ctr("a"))
			p.Spec.Containers = append(p.Spec.Containers, ctr("other"))
			return p
		}()},
			want: []found{{RuleSensitiveHostPath, effectDeny, "a", at,
				msg("/var/lib/k0s/run", "/var/lib/k0s (runtime state)", "readOnly, a non-root user, runAsGroup above 0, supplementalGroupsPolicy: Strict, "+
					"allowPrivilegeEscalation: false, capabilities.drop [ALL]"), editNone}}},
	}, hostPathClass(func(in *Input, hp hostPathVolume) []Finding {
		reach, _ := in.e.guardedRelation(hp.path)
		return parentHostPath(in, hp, reach)
	}), nil)
}

// TestParentHostPathTakesPinsAsPinned: the groups pin-parent-groups
// planned count as set.
func TestParentHostPathTakesPinsAsPinned(t *testing.T) {
	in := inputOf(t, nil, mutating(hostPathPod("/var/lib", true, withSC(ctr("a"), unprivileged()))))
	run := hostPathClass(func(in *Input, hp hostPathVolume) []Finding { return parentHostPath(in, hp, "/var/lib/kubelet") })
	if fs := run(in); len(fs) != 1 {
		t.Fatalf("unpinned: %+v", foundOf(fs))
	}
	in.sofar.pins = groupPins{strict: true, group: []int{0}}
	if fs := run(in); fs != nil {
		t.Errorf("pinned: %+v", foundOf(fs))
	}
}
