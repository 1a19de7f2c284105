package policy

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gpuguard/gpuguard/config"
)

// checkAddedCapabilities is the rule added-capabilities: capabilities by
// allow-list, as Pod Security baseline judges them.
//
// Fields read, in every container kind:
//   - securityContext.capabilities.add, securityContext.privileged;
//   - spec.hostPID and the host path volumes, for SYS_PTRACE.
//
// Allowed values: the capabilities of allowedCapabilities (Pod Security
// baseline's list and IPC_LOCK by default), written with or without CAP_ in
// any ASCII case; SYS_PTRACE in a pod that sees no process beyond its own
// (neither hostPID nor a host path of /proc: seesNodeProcesses), as kubectl
// debug's general profile adds it to a debug container. Every other
// capability reaches the GPUs or the host past the device cgroup: SYS_MODULE loads kernel modules (a driver's among them),
// SYS_RAWIO writes PCI config space and /dev/mem, DAC_READ_SEARCH opens host
// files by handle (open_by_handle_at), SYS_BOOT loads a new kernel, BPF and
// PERFMON read kernel memory, SYS_PTRACE with a view of the node's
// processes enters their namespaces, NET_ADMIN and NET_RAW reach the node's
// loopback services with hostNetwork. A name outside plain ASCII is never
// allowed (capability-name says why).
//
// A privileged container has every capability: it is left to the rule
// privileged. SYS_ADMIN and ALL are left to the rule capabilities where the
// policy makes it deny, so that one cause is reported once.
// Default action: deny, whatever the action.
func checkAddedCapabilities(in *Input, c *containerRef) []Finding {
	sc := c.c.SecurityContext
	if sc == nil || sc.Capabilities == nil || (sc.Privileged != nil && *sc.Privileged) {
		return nil
	}
	first, bad := -1, []string(nil)
	for i, a := range sc.Capabilities.Add {
		if in.e.mayAdd(string(a), in.seesNodeProcesses()) {
			continue
		}
		if first < 0 {
			first = i
		}
		bad = append(bad, string(a))
	}
	if first < 0 {
		return nil
	}
	return []Finding{containerFinding(RuleAddedCapabilities, effectDeny, c,
		c.path().Child("securityContext", "capabilities", "add").Index(first).String(),
		"adds %s, outside the policy's allowedCapabilities: such capabilities reach GPUs or the host past the device cgroup; "+
			"drop them, or exempt the service account from %s", strings.Join(bad, ", "), RuleAddedCapabilities)}
}

// mayAdd reports whether added-capabilities lets a container add the
// capability a, in a pod that sees the node's processes or not.
func (e *Engine) mayAdd(a string, nodeProcesses bool) bool {
	if !plainCapabilityName.MatchString(a) {
		return false
	}
	name := strings.TrimPrefix(strings.ToUpper(a), "CAP_") // ASCII only, as matched
	return e.addable[name] || (name == debugCapability && !nodeProcesses)
}

// debugCapability is what kubectl debug's general profile adds to a debug
// container: harmless where the pod sees only its own processes.
const debugCapability = "SYS_PTRACE"

// addableCapabilities are the capabilities added-capabilities lets any
// container add: the policy's, and those the rule capabilities denies
// itself.
func addableCapabilities(s *config.PolicySpec) []string {
	names := slices.Clone(s.AllowedCapabilities)
	if s.Advisories.Capabilities == config.SeverityDeny {
		names = append(names, devicesCapabilities...)
	}
	return names
}

// addsUnallowedCEL holds for a container c whose added capabilities hold
// one that added-capabilities does not let it add.
func addsUnallowedCEL(s *config.PolicySpec) string {
	debug := fmt.Sprintf(`(a.upperAscii() in %s && !%s)`, capabilitiesCEL([]string{debugCapability}), seesNodeProcessesCEL())
	return addsCapabilityCEL + `.exists(a, !(a.upperAscii() in ` + capabilitiesCEL(addableCapabilities(s)) + `) && !` + debug + `)`
}

// addsCapabilityCEL is the added capabilities of a container c, where it
// adds any: a list to test with exists.
const addsCapabilityCEL = `has(c.securityContext) && has(c.securityContext.capabilities) && has(c.securityContext.capabilities.add) && ` +
	`c.securityContext.capabilities.add`

// RuleAddedCapabilities is the rule of checkAddedCapabilities.
const RuleAddedCapabilities RuleID = "added-capabilities"

func init() {
	register(&Rule{
		ID: RuleAddedCapabilities,
		Summary: "a container adding a capability outside `allowedCapabilities` (Pod Security baseline's list and `IPC_LOCK`; " +
			"`SYS_PTRACE` too in a pod without `hostPID` or a `/proc` host path, for `kubectl debug`); privileged containers are left to `privileged` (deny)",
		Order: 177, ContainerCheck: checkAddedCapabilities,
		// SYS_PTRACE always: the trigger reads no volume, and a host path
		// CEL cannot clean may be /proc.
		Trigger: func(in *CELInput) *CELTrigger {
			return &CELTrigger{Container: addsCapabilityCEL + `.exists(a, !(a.upperAscii() in ` + capabilitiesCEL(addableCapabilities(&in.Policy.Spec)) + `))`}
		},
		Gap: "`SYS_PTRACE` beside a host path that needs cleaning (`..`, `//`, `./`) is left to the webhook, as sensitive-hostpath leaves such paths",
		CEL: func(in *CELInput) *CELCheck {
			pred := `!(has(c.securityContext.privileged) && c.securityContext.privileged) && ` + addsUnallowedCEL(&in.Policy.Spec)
			// has(c.securityContext) comes first in addsUnallowedCEL.
			pred = `has(c.securityContext) && ` + pred
			return &CELCheck{Plain: pred, GPU: pred, Message: "adds a capability the policy does not allow (allowedCapabilities)"}
		},
	})
}
