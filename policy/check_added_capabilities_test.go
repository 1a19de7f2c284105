package policy

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuguard/gpuguard/config"
)

func TestCheckAddedCapabilities(t *testing.T) {
	adds := func(privileged bool, caps ...corev1.Capability) *corev1.SecurityContext {
		return &corev1.SecurityContext{Privileged: ptr(privileged), Capabilities: &corev1.Capabilities{Add: caps}}
	}
	msg := func(caps string) string {
		return "adds " + caps + ", outside the policy's allowedCapabilities: such capabilities reach GPUs or the host past the device cgroup; " +
			"drop them, or exempt the service account from added-capabilities"
	}
	at := func(i int) string { return sprintf("spec.containers[0].securityContext.capabilities.add[%d]", i) }
	hostPID := func(p *corev1.Pod) *corev1.Pod { p.Spec.HostPID = true; return p }
	debugger := func(caps ...corev1.Capability) *corev1.Pod {
		p := podOf(ctr("app"))
		ec := ephemeral("debugger")
		ec.TargetContainerName = "app"
		ec.SecurityContext = adds(false, caps...)
		p.Spec.EphemeralContainers = []corev1.EphemeralContainer{ec}
		return p
	}
	runRuleTable(t, []ruleCase{
		{name: "no capabilities", req: Request{Object: podOf(ctr("a"))}},
		{name: "dropped only", req: Request{Object: podOf(withSC(ctr("a"), &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}))}},
		{name: "baseline's and IPC_LOCK, any case, with CAP_", req: Request{Object: podOf(withSC(ctr("a"), adds(false, "NET_BIND_SERVICE", "cap_chown", "ipc_lock", "CAP_SETUID")))}},
		{name: "RDMA trainer on a GPU", req: Request{Object: podOf(withSC(gpuCtr("a"), adds(false, "IPC_LOCK")))}},
		{name: "every one outside the list, at the first", req: Request{Object: podOf(withSC(ctr("a"), adds(false, "CHOWN", "SYS_MODULE", "cap_sys_rawio", "DAC_READ_SEARCH")))},
			want: []found{{RuleAddedCapabilities, effectDeny, "a", at(1), msg("SYS_MODULE, cap_sys_rawio, DAC_READ_SEARCH"), editNone}}},
		{name: "SYS_ADMIN while capabilities warns", req: Request{Object: podOf(withSC(gpuCtr("a"), adds(false, "SYS_ADMIN")))},
			want: []found{{RuleAddedCapabilities, effectDeny, "a", at(0), msg("SYS_ADMIN"), editNone}}},
		{name: "SYS_ADMIN and ALL left to capabilities where it denies", policy: func(s *config.PolicySpec) { s.Advisories.Capabilities = config.SeverityDeny },
			req: Request{Object: podOf(withSC(ctr("a"), adds(false, "SYS_ADMIN", "all")))}},
		{name: "NET_RAW and NET_ADMIN", req: Request{Object: podOf(withSC(ctr("a"), adds(false, "NET_RAW", "NET_ADMIN")))},
			want: []found{{RuleAddedCapabilities, effectDeny, "a", at(0), msg("NET_RAW, NET_ADMIN"), editNone}}},
		{name: "not plain ASCII: never allowed", req: Request{Object: podOf(withSC(ctr("a"), adds(false, "ſetuid")))},
			want: []found{{RuleAddedCapabilities, effectDeny, "a", at(0), msg("ſetuid"), editNone}}},
		{name: "privileged left to privileged", req: Request{Object: podOf(withSC(ctr("a"), adds(true, "SYS_MODULE")))}},
		{name: "the policy's list", policy: func(s *config.PolicySpec) { s.AllowedCapabilities = []string{"SYS_ADMIN"} },
			req:  Request{Object: podOf(withSC(ctr("a"), adds(false, "SYS_ADMIN", "CHOWN")))},
			want: []found{{RuleAddedCapabilities, effectDeny, "a", at(1), msg("CHOWN"), editNone}}},
		{name: "kubectl debug --profile=general", req: Request{Object: debugger("SYS_PTRACE")}},
		{name: "SYS_PTRACE in its own pod", req: Request{Object: podOf(withSC(ctr("a"), adds(false, "CAP_SYS_PTRACE")))}},
		{name: "SYS_PTRACE with hostPID", req: Request{Object: hostPID(podOf(withSC(ctr("a"), adds(false, "sys_ptrace"))))},
			want: []found{{RuleAddedCapabilities, effectDeny, "a", at(0), msg("sys_ptrace"), editNone}}},
		{name: "debugger with hostPID", req: Request{Object: hostPID(debugger("SYS_PTRACE"))},
			want: []found{{RuleAddedCapabilities, effectDeny, "debugger", "spec.ephemeralContainers[0].securityContext.capabilities.add[0]", msg("SYS_PTRACE"), editNone}}},
		{name: "SYS_PTRACE beside a /proc host path", req: Request{Object: hostPathPod("/proc", true, withSC(ctr("a"), adds(false, "SYS_PTRACE")))},
			want: []found{{RuleAddedCapabilities, effectDeny, "a", at(0), msg("SYS_PTRACE"), editNone}}},
		{name: "SYS_PTRACE beside /proc/sys/net", req: Request{Object: hostPathPod("/proc/sys/net", true, withSC(ctr("a"), adds(false, "SYS_PTRACE")))}},
	}, nil, checkAddedCapabilities)
}
