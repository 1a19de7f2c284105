package policy

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/policy/celexpr"
)

// pinParentGroups is the mutation pin-parent-groups, in the mutating phase of
// a new pod and, as a plan, on a controller's template.
//
// Fields read: spec.volumes[*].hostPath.path; for a volume that is a strict
// parent of a sensitive path, in every container that mounts it, what
// sensitive-hostpath reads.
//
// Effect, when the policy's sensitiveHostPathParents is readOnlyUnprivileged:
// where every container mounting a strict parent of a sensitive path meets
// every condition of sensitive-hostpath but its groups, and the groups can be
// made safe without guessing, they are pinned:
//   - supplementalGroupsPolicy: Strict on the pod, where it is unset (Merge),
//     so that the image's /etc/group adds no group;
//   - runAsGroup on each such container whose group is unset (the image's
//     /etc/passwd would choose it), set to PinnedGroup (nogroup); the
//     container's user must be set, since the runtime refuses a group
//     without one.
//
// Pinning is all or nothing: a container with another problem (a process
// namespace shared with the pod among them), a runAsGroup of 0, a user known
// only as runAsNonRoot, fsGroup or supplementalGroups
// holding 0, or an explicit Merge leaves the pod as it is, and
// sensitive-hostpath denies it. Reapplying changes nothing. A template is
// never patched: its pods will be, which a warning says (and check prints).
func pinParentGroups(in *Input) []Finding {
	if in.e.policy.Spec.SensitiveHostPathParents == config.ParentsDeny || (in.t.isPod && !in.mutable) {
		return nil
	}
	pins, ok := in.planGroupPins()
	if !ok || pins.empty() {
		return nil
	}
	out := []Finding{editOf(RulePinParentGroups, nil, edit{kind: editPinGroups, pins: pins})}
	if in.scope == scopeTemplate {
		for _, n := range pins.notes(in.t.specPath, in.containers, "its pods get") {
			out = append(out, podFinding(RulePinParentGroups, effectWarn, n.Path, "%s", n.Message))
		}
	}
	return out
}

// groupPins are the group settings gpuguard adds to a pod.
type groupPins struct {
	strict bool  // supplementalGroupsPolicy: Strict on the pod
	group  []int // containers (by containerRef.pos, ascending) given runAsGroup: PinnedGroup
}

func (p groupPins) empty() bool { return !p.strict && len(p.group) == 0 }

// planGroupPins finds what to pin; ok is false where the pod's parent
// mounts cannot all be made safe by pinning, or it has none.
func (in *Input) planGroupPins() (pins groupPins, ok bool) {
	spec := in.t.spec
	pod := spec.SecurityContext
	if pod == nil {
		pod = &corev1.PodSecurityContext{}
	}
	found := false
	for _, v := range spec.Volumes {
		if v.HostPath == nil {
			continue
		}
		if s, below := in.e.guardedRelation(cleanAbsolute(v.HostPath.Path)); s == "" || below {
			continue
		}
		for k := range in.containers {
			c := &in.containers[k]
			if !mounts(c.c, v.Name) {
				continue
			}
			pin, ok := pinnableGroup(spec, pod, c.c, v.Name)
			if !ok {
				return groupPins{}, false
			}
			if pin && !slices.Contains(pins.group, c.pos) {
				pins.group = append(pins.group, c.pos)
			}
			found = true
		}
	}
	if !found {
		return groupPins{}, false
	}
	if rootInGroups(pod) || (pod.SupplementalGroupsPolicy != nil && *pod.SupplementalGroupsPolicy != corev1.SupplementalGroupsPolicyStrict) {
		return groupPins{}, false
	}
	pins.strict = pod.SupplementalGroupsPolicy == nil
	slices.Sort(pins.group)
	return pins, true
}

// pinnableGroup: container c meets every condition for mounting volume but
// its groups, and its group is set above 0 (pin false) or can be pinned to
// PinnedGroup (pin true). Pinning needs its user set above 0: the runtime
// refuses a group without a user.
func pinnableGroup(spec *corev1.PodSpec, pod *corev1.PodSecurityContext, c *corev1.Container, volume string) (pin, ok bool) {
	sc := c.SecurityContext
	if sc == nil || len(readOnlyParentProblems(spec, c, volume, pod, sc, false)) > 0 {
		return false, false
	}
	if g := effectiveID(pod.RunAsGroup, sc.RunAsGroup); g != nil {
		return false, *g > 0
	}
	uid := effectiveID(pod.RunAsUser, sc.RunAsUser)
	return true, uid != nil && *uid > 0
}

// PinnedGroup is the group pin-parent-groups gives a container without one:
// nogroup, which owns nothing on a node. The container's user would be the
// convention of images, but on the host that ID may be a group that owns a
// socket (docker's is often 999, as common an ID for a service user).
const PinnedGroup int64 = 65534

// applied is the pod's and container c's security contexts with the pins
// applied.
func (p groupPins) applied(pod *corev1.PodSecurityContext, c *containerRef) (*corev1.PodSecurityContext, *corev1.SecurityContext) {
	sc := c.c.SecurityContext
	if p.strict {
		pinned := corev1.PodSecurityContext{}
		if pod != nil {
			pinned = *pod
		}
		strict := corev1.SupplementalGroupsPolicyStrict
		pinned.SupplementalGroupsPolicy = &strict
		pod = &pinned
	}
	if slices.Contains(p.group, c.pos) {
		pinned := *sc
		gid := PinnedGroup
		pinned.RunAsGroup = &gid
		sc = &pinned
	}
	return pod, sc
}

// patch renders the pins as JSON Patch operations on a Pod.
func (p groupPins) patch(spec *corev1.PodSpec, containers []containerRef) []jsonpatch.Operation {
	var ops []jsonpatch.Operation
	if p.strict {
		if spec.SecurityContext == nil {
			ops = append(ops, jsonpatch.NewOperation("add", "/spec/securityContext",
				map[string]any{"supplementalGroupsPolicy": string(corev1.SupplementalGroupsPolicyStrict)}))
		} else {
			ops = append(ops, jsonpatch.NewOperation("add", "/spec/securityContext/supplementalGroupsPolicy",
				string(corev1.SupplementalGroupsPolicyStrict)))
		}
	}
	for _, pos := range p.group {
		ops = append(ops, jsonpatch.NewOperation("add", containers[pos].pointer()+"/securityContext/runAsGroup", PinnedGroup))
	}
	return ops
}

// notes say what the pins set, one warning each, the verb telling pods
// ("set") from templates ("its pods get"): the value, and that a read-only
// parent of a sensitive host path is why.
func (p groupPins) notes(specPath *field.Path, containers []containerRef, verb string) []Warning {
	var out []Warning
	if p.strict {
		out = append(out, Warning{Rule: RulePinParentGroups, Path: specPath.Child("securityContext", "supplementalGroupsPolicy").String(),
			Message: verb + " Strict, for the host path parent it mounts"})
	}
	for _, pos := range p.group {
		out = append(out, Warning{Rule: RulePinParentGroups, Path: containers[pos].path().Child("securityContext", "runAsGroup").String(),
			Message: verb + " " + strconv.FormatInt(PinnedGroup, 10) + " (nogroup), for the host path parent it mounts"})
	}
	return out
}

// RulePinParentGroups is the rule of pinParentGroups.
const RulePinParentGroups RuleID = "pin-parent-groups"

func init() {
	register(&Rule{
		ID: RulePinParentGroups,
		Summary: "(mutation) on a new pod whose read-only parent host path lacks only safe groups: `supplementalGroupsPolicy: Strict` " +
			"where unset and `runAsGroup: 65534` (nogroup) where unset; all or nothing, idempotent",
		// Its CEL form is part of the backstop's MutatingAdmissionPolicy.
		Order: 29, PodCheck: pinParentGroups, PodScopes: []scope{scopePod, scopeTemplate},
		Trigger: func(in *CELInput) *CELTrigger {
			if in.Policy.Spec.SensitiveHostPathParents == config.ParentsDeny {
				return nil
			}
			return &CELTrigger{Pod: hostPathTrigger}
		},
	})
}

// hostPathTrigger holds for a pod with any host path volume.
const hostPathTrigger = `has(object.spec.volumes) && object.spec.volumes.exists(v, has(v.hostPath))`

// ParentGroupPinsCEL is pin-parent-groups for the backstop's
// MutatingAdmissionPolicy: a CEL list of JSON Patch operations over a pod
// being created, empty where nothing is pinned; "" where the policy denies
// parents outright. Paths CEL cannot clean are left to the webhook, as
// sensitive-hostpath leaves them.
func ParentGroupPinsCEL(in *CELInput) string {
	if in.Policy.Spec.SensitiveHostPathParents == config.ParentsDeny {
		return ""
	}
	below, parent := sensitiveRelationCEL(in)
	isParent := fmt.Sprintf(`has(v.hostPath) && %s && !(%s) && %s`, celexpr.Judgeable("v.hostPath.path"), below, parent)
	pinnable := fmt.Sprintf(`%s && %s && (%s ? %s > 0 : %s > 0)`, mountsReadOnlyCEL, unprivilegedCEL(),
		celIDSet("runAsGroup"), celIDOf("runAsGroup"), celIDOf("runAsUser"))
	// Each kind of container on its own: the lists' types differ.
	var mounted, safe []string
	for _, l := range kindFields {
		list := fmt.Sprintf(`(has(object.spec.%[1]s) ? object.spec.%[1]s : [])`, l)
		mounted = append(mounted, fmt.Sprintf(`%s.exists(c, %s)`, list, mountsVolumeCEL))
		safe = append(safe, fmt.Sprintf(`%s.all(c, !(%s) || (%s))`, list, mountsVolumeCEL, pinnable))
	}
	pod := fmt.Sprintf(`request.operation == "CREATE" && has(object.spec.volumes) && `+
		`object.spec.volumes.exists(v, %[1]s && (%[2]s)) && object.spec.volumes.all(v, !(%[1]s) || (%[3]s)) && %[4]s`,
		isParent, celexpr.Or(mounted...), strings.Join(safe, " && "), podGroupsCEL(false))
	strict := fmt.Sprintf(`(%s ? [] : [has(object.spec.securityContext) ? `+
		`JSONPatch{op: "add", path: "/spec/securityContext/supplementalGroupsPolicy", value: "Strict"} : `+
		`JSONPatch{op: "add", path: "/spec/securityContext", value: Object.spec.securityContext{supplementalGroupsPolicy: "Strict"}}])`,
		podHas("supplementalGroupsPolicy"))
	patches := []string{strict}
	mountsParent := fmt.Sprintf(`has(c.volumeMounts) && object.spec.volumes.exists(v, %s && c.volumeMounts.exists(m, m.name == v.name))`, isParent)
	for _, l := range kindFields {
		patches = append(patches, fmt.Sprintf(`(has(object.spec.%[1]s) ? object.spec.%[1]s.transformList(i, c, %[2]s && !(%[3]s), `+
			`[JSONPatch{op: "add", path: "/spec/%[1]s/" + string(i) + "/securityContext/runAsGroup", value: %[4]d}]).flatten() : [])`,
			l, mountsParent, celIDSet("runAsGroup"), PinnedGroup))
	}
	return fmt.Sprintf(`(%s ? %s : [])`, pod, strings.Join(patches, " + "))
}
