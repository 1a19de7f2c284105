package policy

import (
	"slices"

	"github.com/gpuguard/gpuguard/config"
)

// checkHostNetworkIPC is the rule host-network-ipc: a pod without a GPU
// container that shares the node's network or IPC namespace, where the
// node's GPU services listen without device nodes in the way.
//
// Fields read: spec.hostNetwork, spec.hostIPC; the resources.limits of every
// container.
//
// Allowed values: hostNetwork and hostIPC unset or false on a pod none of
// whose containers has GPU resources. On the node's network a pod reaches
// what listens on its loopback: DCGM's host engine (nv-hostengine, TCP 5555,
// no authentication) runs diagnostics on every GPU and changes clocks and
// power limits; on the node's IPC namespace it shares the host's /dev/shm
// and System V segments, where an MPS daemon started on the host keeps its
// clients' memory. The device cgroup guards none of it.
//
// Judged per pod, not per container: the namespaces are the pod's, and a
// pod that holds a GPU is a GPU workload (multi-node training runs NCCL on
// the node's network), which the device plugin, not this rule, accounts
// for. Its CPU sidecars share what its GPU containers already reach.
// Default: deny (advisories.hostNetworkIPC); node infrastructure on the
// node's network (CNI and mesh agents, node exporters, ingress on host
// ports) runs in namespaces the chart leaves unguarded or under exempt
// service accounts.
func checkHostNetworkIPC(in *Input) []Finding {
	spec := in.t.spec
	if !spec.HostNetwork && !spec.HostIPC {
		return nil
	}
	if slices.ContainsFunc(in.containers, func(c containerRef) bool { return c.gpu }) {
		return nil
	}
	sev := severityEffect(in.e.policy.Spec.Advisories.HostNetworkIPC)
	var out []Finding
	if spec.HostNetwork {
		out = append(out, podFinding(RuleHostNetworkIPC, sev, in.t.specPath.Child("hostNetwork").String(),
			"shares the node's network without a GPU container: it reaches the node's GPU services on its loopback "+
				"(DCGM's host engine, unauthenticated, controls every GPU); drop it, or exempt the service account from host-network-ipc"))
	}
	if spec.HostIPC {
		out = append(out, podFinding(RuleHostNetworkIPC, sev, in.t.specPath.Child("hostIPC").String(),
			"shares the node's IPC namespace without a GPU container: it reaches the host's /dev/shm and shared memory, "+
				"MPS's included; drop it, or exempt the service account from host-network-ipc"))
	}
	return out
}

// hostNetworkIPCCEL holds for a pod on the node's network or IPC namespace.
const hostNetworkIPCCEL = `((has(object.spec.hostNetwork) && object.spec.hostNetwork) || (has(object.spec.hostIPC) && object.spec.hostIPC))`

// RuleHostNetworkIPC is the rule of checkHostNetworkIPC.
const RuleHostNetworkIPC RuleID = "host-network-ipc"

func init() {
	register(&Rule{
		ID: RuleHostNetworkIPC,
		Summary: "`hostNetwork` or `hostIPC` on a pod without a GPU container: the node's GPU services (DCGM's host engine, MPS) " +
			"without device nodes (deny by default)",
		Order: 32, PodCheck: checkHostNetworkIPC, PodScopes: []scope{scopePod, scopeTemplate},
		// Any severity, GPU containers or not.
		Trigger: func(in *CELInput) *CELTrigger { return &CELTrigger{Pod: hostNetworkIPCCEL} },
		Gap:     "warnings: rendered only when the policy's severity is `deny` (the default)",
		CEL: func(in *CELInput) *CELCheck {
			if in.Policy.Spec.Advisories.HostNetworkIPC != config.SeverityDeny {
				return nil
			}
			return &CELCheck{Message: "shares the node's network or IPC namespace without a GPU container, reaching the node's GPU services",
				Pod: `request.operation == "CREATE" && ` + hostNetworkIPCCEL + ` && ` + in.NoGPUContainer}
		},
	})
}
