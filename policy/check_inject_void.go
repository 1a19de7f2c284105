package policy

import (
	"fmt"

	"github.com/gpuguard/gpuguard/policy/celexpr"
)

// injectVoid is the mutation inject-void, in the mutating phase of a pod.
//
// Fields read, in every container kind:
//   - resources.limits, to tell GPU containers;
//   - env[*], for the last entry of NVIDIA_VISIBLE_DEVICES and of each of the
//     policy's env.extraDeviceVariables, after the planned strips and rewrites.
//
// Effect, when the policy's injectVoid is on: every container without GPU resources
// whose effective value is not "void" or "" gets NVIDIA_VISIBLE_DEVICES=void appended
// to its env. Pod env outranks image ENV, envFrom and the toolkit's legacy rule
// (CUDA_VERSION set and NVIDIA_REQUIRE_CUDA unset means every GPU), so only an
// explicit void is safe; removing the variable is not. GPU containers are never
// touched: a pod-level value would replace the device plugin's allocation.
// Injecting twice changes nothing, so the webhook may be reinvoked.
//
// With injectVoid off (the hardened profile among them), a container the
// toolkit counts as privileged (toolkitPrivileged) still gets void: the
// node's refusal of env device requests, which the profile relies on, does
// not hold for it.
func injectVoid(in *Input, c *containerRef) []Finding {
	if c.gpu || !(in.e.policy.Spec.InjectVoid || toolkitPrivileged(c.c)) {
		return nil
	}
	// A template is never patched; its pods will be: say which containers
	// of them will get void (Result.TemplateVoid, which check prints).
	if in.scope == scopeTemplate {
		if !in.effectivelyVoid(c, visibleDevices) {
			return []Finding{editOf(RuleInjectVoid, c, edit{kind: editTemplateVoid})}
		}
		return nil
	}
	// Only pods are patched, in the mutating phase.
	if !in.t.isPod || !in.mutable {
		return nil
	}
	var out []Finding
	for _, name := range in.e.deviceVars {
		if !in.effectivelyVoid(c, name) {
			out = append(out, editOf(RuleInjectVoid, c, edit{kind: editAppendVoid, name: name}))
		}
	}
	return out
}

// effectivelyVoid reports whether the last env entry for name, after the
// edits planned so far (strips, rewrites of "none"), is a literal "void" or
// "", or KAI's fraction entry where the policy accepts it (kai.go). An unset
// variable is not void.
func (in *Input) effectivelyVoid(c *containerRef, name string) bool {
	for i := len(c.c.Env) - 1; i >= 0; i-- {
		v := &c.c.Env[i]
		if v.Name != name || in.removed(c, i) {
			continue
		}
		if replacement, ok := in.replacement(c, i); ok {
			return replacement == voidValue
		}
		return (v.ValueFrom == nil && (v.Value == voidValue || v.Value == "")) || in.kaiFractionRef(c, v)
	}
	return false
}

// RuleInjectVoid is the rule of injectVoid.
const RuleInjectVoid RuleID = "inject-void"

func init() {
	register(&Rule{
		ID: RuleInjectVoid,
		Summary: "(mutation) `NVIDIA_VISIBLE_DEVICES=void` appended to every non-GPU container whose effective value is not `void`/`\"\"` " +
			"(with `injectVoid` off, to those the toolkit counts as privileged), and a new pod annotated `gpuguard.io/void` with their names; " +
			"GPU containers are never touched; idempotent",
		// Its CEL form is the backstop's MutatingAdmissionPolicy.
		Order: 190, ContainerCheck: injectVoid,
		Trigger: func(in *CELInput) *CELTrigger {
			if in.Policy.Spec.InjectVoid {
				return notVoidTrigger(in)
			}
			return &CELTrigger{Container: looksForGPUTrigger + " && " + missingDeviceVarCEL(in) + " && !(" + in.IsGPU + ")"}
		},
	})
}

// notVoidTrigger is the trigger of inject-void and final-state (nothing,
// when the policy injects nothing): a container without GPU resources that
// has no entry for a device variable. That is all it needs to catch, beside
// device-env's trigger, which holds for every entry but a literal "void" or
// "": where neither holds, the container's last entry for each variable is
// void or "", so it is effectively void. Cheap tests come first: after the
// backstop's injection, an ordinary container has its entry, and its
// resources are never read.
func notVoidTrigger(in *CELInput) *CELTrigger {
	if !in.Policy.Spec.InjectVoid {
		return nil
	}
	return &CELTrigger{Container: missingDeviceVarCEL(in) + " && !(" + in.IsGPU + ")"}
}

// missingDeviceVarCEL: container c has no env entry for one of the device
// variables.
func missingDeviceVarCEL(in *CELInput) string {
	var missing []string
	for _, n := range in.DeviceVars {
		missing = append(missing, fmt.Sprintf("!(has(c.env) && c.env.exists(e, e.name == %s))", celexpr.Str(n)))
	}
	return "(" + celexpr.Or(missing...) + ")"
}

// ToolkitPrivilegedCEL is toolkitPrivileged over a container c, for the
// backstop's injection with injectVoid off.
var ToolkitPrivilegedCEL = `(has(c.securityContext) && ((has(c.securityContext.privileged) && c.securityContext.privileged) || (` +
	addsDevicesCapabilityCEL + `)))`
