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
	}, checkNamespaceEntry, nil)
}
