package policy

import (
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
)

func TestProcLinkHostPath(t *testing.T) {
	msg := func(p string) string {
		return sprintf("%q is a link of /proc that the runtime follows on the host, to the host's root or wherever a process's directory or file is; "+
			"name the host path itself", p)
	}
	pod := hostPathPod("/proc/1/root", true, ctr("a"))
	// An UPDATE adding an ephemeral container that does not mount it.
	old := pod.DeepCopy()
	withDebug := pod.DeepCopy()
	withDebug.Spec.EphemeralContainers = append(withDebug.Spec.EphemeralContainers, ephemeral("debug"))
	runRuleTable(t, []ruleCase{
		{name: "a PID's root", req: Request{Object: pod},
			want: []found{{RuleSensitiveHostPath, effectDeny, "", "spec.volumes[1].hostPath.path", msg("/proc/1/root"), editNone}}},
		{name: "through a task, uncleaned", req: Request{Object: hostPathPod("/proc//self/task/7/fd/", false, ctr("a"))},
			want: []found{{RuleSensitiveHostPath, effectDeny, "", "spec.volumes[1].hostPath.path", msg("/proc//self/task/7/fd/"), editNone}}},
		{name: "ephemeral container not mounting it", req: Request{Operation: admissionv1.Update, SubResource: SubresourceEphemeralContainers,
			Object: withDebug, OldObject: old}},
	}, hostPathClass(procLinkHostPath), nil)
}
