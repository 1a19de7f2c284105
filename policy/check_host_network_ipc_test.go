package policy

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuguard/gpuguard/config"
)

func TestCheckHostNetworkIPC(t *testing.T) {
	on := func(network, ipc bool, cs ...corev1.Container) *corev1.Pod {
		p := podOf(cs...)
		p.Spec.HostNetwork, p.Spec.HostIPC = network, ipc
		return p
	}
	netMsg := "shares the node's network without a GPU container: it reaches the node's GPU services on its loopback " +
		"(DCGM's host engine, unauthenticated, controls every GPU); drop it, or exempt the service account from host-network-ipc"
	ipcMsg := "shares the node's IPC namespace without a GPU container: it reaches the host's /dev/shm and shared memory, " +
		"MPS's included; drop it, or exempt the service account from host-network-ipc"
	initGPU := on(true, false, ctr("a"))
	initGPU.Spec.InitContainers = []corev1.Container{gpuCtr("warmup")}
	runRuleTable(t, []ruleCase{
		{name: "neither", req: Request{Object: on(false, false, ctr("a"))}},
		{name: "hostNetwork on a GPU pod", req: Request{Object: on(true, true, gpuCtr("g"), ctr("sidecar"))}},
		{name: "a GPU init container makes a GPU pod", req: Request{Object: initGPU}},
		{name: "hostNetwork without a GPU container", req: Request{Object: on(true, false, ctr("a"))},
			want: []found{{RuleHostNetworkIPC, effectDeny, "", "spec.hostNetwork", netMsg, editNone}}},
		{name: "hostIPC without a GPU container", req: Request{Object: on(false, true, ctr("a"))},
			want: []found{{RuleHostNetworkIPC, effectDeny, "", "spec.hostIPC", ipcMsg, editNone}}},
		{name: "both", req: Request{Object: on(true, true, ctr("a"))},
			want: []found{{RuleHostNetworkIPC, effectDeny, "", "spec.hostNetwork", netMsg, editNone},
				{RuleHostNetworkIPC, effectDeny, "", "spec.hostIPC", ipcMsg, editNone}}},
		{name: "warned by the policy", policy: func(s *config.PolicySpec) { s.Advisories.HostNetworkIPC = config.SeverityWarn },
			req:  Request{Object: on(true, false, ctr("a"))},
			want: []found{{RuleHostNetworkIPC, effectWarn, "", "spec.hostNetwork", netMsg, editNone}}},
	}, checkHostNetworkIPC, nil)
}
