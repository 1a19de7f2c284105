package policy

import (
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
)

func TestCheckNamespaceEntry(t *testing.T) {
	hostPID := func(p *corev1.Pod) *corev1.Pod {
		p.Spec.HostPID = true
		return p
	}
	// target mounts a read-only parent; an ephemeral container enters it.
	target := hostPathPod("/var/lib", true, withSC(ctr("target"), unprivileged()))
	entering := func(sc *corev1.SecurityContext) *corev1.Pod {
		p := target.DeepCopy()
		e := ephemeral("debug")
		e.TargetContainerName = "target"
		e.SecurityContext = sc
		p.Spec.EphemeralContainers = append(p.Spec.EphemeralContainers, e)
		return p
	}
	debug := func(sc *corev1.SecurityContext) Request {
		return Request{Operation: admissionv1.Update, SubResource: SubresourceEphemeralContainers, Object: entering(sc), OldObject: target}
	}
	runRuleTable(t, []ruleCase{
		{name: "hostPID, unprivileged", req: Request{Object: hostPID(podOf(withSC(ctr("a"), unprivileged())))}},
		{name: "hostPID, root", req: Request{Object: hostPID(podOf(withSC(ctr("a"), unprivileged()), ctr("root")))},
			want: []found{{RuleNamespaceEntry, effectDeny, "root", "spec.hostPID",
				"shares the node's process namespace (hostPID) without a non-root user, allowPrivilegeEscalation: false, capabilities.drop [ALL]; " +
					"as root it enters the host's filesystem and its runtime's socket through /proc/1/root", editNone}}},
		{name: "entering a parent mount, groups unknown", req: debug(unprivileged()),
			want: []found{{RuleNamespaceEntry, effectDeny, "debug", "spec.ephemeralContainers[0].targetContainerName",
				`enters the process namespace of "target", which mounts "/var/lib" (reaching /var/lib/kubelet/device-plugins), ` +
					"without runAsGroup above 0, supplementalGroupsPolicy: Strict; it would reach that mount through /proc/PID/root", editNone}}},
		{name: "/proc, unprivileged", req: Request{Object: hostPathPod("/proc", true, withSC(ctr("a"), unprivileged()))}},
		{name: "/proc/sys/net as root: no process's view", req: Request{Object: hostPathPod("/proc/sys/net", true, ctr("a"))}},
		{name: "/proc/1/root left to sensitive-hostpath", req: Request{Object: hostPathPod("/proc/1/root", true, ctr("a"))}},
		{name: "/proc/ as root", req: Request{Object: hostPathPod("/proc/", true, ctr("a"))},
			want: []found{{RuleNamespaceEntry, effectDeny, "a", "spec.volumes[1].hostPath.path",
				`mounts the node's "/proc/", a view of its processes as hostPID gives, without a non-root user, allowPrivilegeEscalation: false, capabilities.drop [ALL]; ` +
					"as root or with SYS_PTRACE it enters the host's filesystem through /proc/1/root", editNone}}},
		{name: "/proc/self/task/1 with SYS_PTRACE", req: Request{Object: hostPathPod("/proc/self/task/1", true, withSC(ctr("a"), func() *corev1.SecurityContext {
			sc := unprivileged()
			sc.Capabilities.Add = []corev1.Capability{"SYS_PTRACE"}
			return sc
		}()))},
			want: []found{{RuleNamespaceEntry, effectDeny, "a", "spec.volumes[1].hostPath.path",
				`mounts the node's "/proc/self/task/1", a view of its processes as hostPID gives, without capabilities.add of NET_BIND_SERVICE or SYS_TIME only; ` +
					"as root or with SYS_PTRACE it enters the host's filesystem through /proc/1/root", editNone}}},
		{name: "hostPID and /proc reported once", req: Request{Object: hostPID(hostPathPod("/proc", true, ctr("a")))},
			want: []found{{RuleNamespaceEntry, effectDeny, "a", "spec.hostPID",
				"shares the node's process namespace (hostPID) without a non-root user, allowPrivilegeEscalation: false, capabilities.drop [ALL]; " +
					"as root it enters the host's filesystem and its runtime's socket through /proc/1/root", editNone}}},
		{name: "entering a /proc mount", req: func() Request {
			tgt := hostPathPod("/proc/1", true, withSC(ctr("target"), unprivileged()))
			p := tgt.DeepCopy()
			e := ephemeral("debug")
			e.TargetContainerName = "target"
			p.Spec.EphemeralContainers = append(p.Spec.EphemeralContainers, e)
			return Request{Operation: admissionv1.Update, SubResource: SubresourceEphemeralContainers, Object: p, OldObject: tgt}
		}(),
			want: []found{{RuleNamespaceEntry, effectDeny, "debug", "spec.ephemeralContainers[0].targetContainerName",
				`enters the process namespace of "target", which mounts "/proc/1" (a view of the node's processes), ` +
					"without a non-root user, runAsGroup above 0, supplementalGroupsPolicy: Strict, allowPrivilegeEscalation: false, capabilities.drop [ALL]; it would reach that mount through /proc/PID/root", editNone}}},
	}, checkNamespaceEntry, nil)
}
