package policy

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuguard/gpuguard/policy/celexpr"
)

// checkNamespaceEntry is the rule namespace-entry: containers that can enter
// another process's mount namespace through /proc/PID/root, and so reach
// what that process mounts.
//
// Fields read: spec.hostPID; spec.ephemeralContainers[*].targetContainerName
// and the target's volumeMounts, with the host path volumes they name; in
// each entering container, what sensitive-hostpath reads of a container
// mounting a parent.
//
// Allowed values:
//   - hostPID: true only where every container runs as a non-root user,
//     without privilege escalation, with every capability dropped (adding
//     back NET_BIND_SERVICE or SYS_TIME at most) and without privilege. A
//     root process that sees the node's processes opens /proc/1/root, the
//     host's root, and the runtime's socket below it; a process of another
//     user cannot without CAP_SYS_PTRACE, and cannot change its user
//     without CAP_SETUID.
//   - an ephemeral container whose targetContainerName names a container
//     that mounts a host path needing the read-only-parent conditions (a
//     parent of a sensitive path, a runtime-state tree) must meet them
//     itself, groups included: it shares that container's process
//     namespace, and a root one takes the target's user and group (the
//     kernel's ptrace check compares those, not the supplementary groups),
//     keeps group 0, and reads the host path through /proc/PID/root.
//
// A process namespace shared by the whole pod (shareProcessNamespace) is
// judged by sensitive-hostpath on each container that mounts such a path.
// Default action: deny, whatever the action.
func checkNamespaceEntry(in *Input) []Finding {
	spec := in.t.spec
	var out []Finding
	for k := range in.containers {
		c := &in.containers[k]
		if spec.HostPID {
			if missing := in.entryProblems(c, false); len(missing) > 0 {
				out = append(out, containerFinding(RuleNamespaceEntry, effectDeny, c, in.t.specPath.Child("hostPID").String(),
					"shares the node's process namespace (hostPID) without %s; as root it enters the host's filesystem and its runtime's socket through /proc/1/root",
					strings.Join(missing, ", ")))
			}
		}
		if c.kind != ephemeralContainer {
			continue
		}
		target := spec.EphemeralContainers[c.index].TargetContainerName
		if what := in.guardedMountOf(target); what != "" {
			if missing := in.entryProblems(c, true); len(missing) > 0 {
				out = append(out, containerFinding(RuleNamespaceEntry, effectDeny, c, c.path().Child("targetContainerName").String(),
					"enters the process namespace of %s, which mounts %s, without %s; it would reach that mount through /proc/PID/root",
					quote(target), what, strings.Join(missing, ", ")))
			}
		}
	}
	return out
}

// entryProblems lists what container c lacks to share a process namespace
// with what it must not enter: the read-only-parent conditions but the
// mount's own, groups only where withGroups is set.
func (in *Input) entryProblems(c *containerRef, withGroups bool) []string {
	pod, sc := in.pinned().applied(in.t.spec.SecurityContext, c)
	return readOnlyParentProblems(in.t.spec, c.c, "", pod, sc, withGroups)
}

// guardedMountOf describes the first host path that the pod's regular or
// init container named target mounts and that needs the read-only-parent
// conditions, or "".
func (in *Input) guardedMountOf(target string) string {
	spec := in.t.spec
	if target == "" {
		return ""
	}
	named := func(c corev1.Container) bool { return c.Name == target }
	var t *corev1.Container
	if i := slices.IndexFunc(spec.Containers, named); i >= 0 {
		t = &spec.Containers[i]
	} else if i = slices.IndexFunc(spec.InitContainers, named); i >= 0 {
		t = &spec.InitContainers[i]
	} else {
		return ""
	}
	for _, v := range spec.Volumes {
		if v.HostPath == nil || !mounts(t, v.Name) {
			continue
		}
		p := cleanAbsolute(v.HostPath.Path)
		if s, below := in.e.guardedRelation(p); s != "" && !below {
			return fmt.Sprintf("%s (reaching %s)", quote(v.HostPath.Path), s)
		}
	}
	return ""
}

// RuleNamespaceEntry is the rule of checkNamespaceEntry.
const RuleNamespaceEntry RuleID = "namespace-entry"

func init() {
	register(&Rule{
		ID: RuleNamespaceEntry,
		Summary: "`hostPID` unless every container is non-root without capabilities, escalation or privilege; an ephemeral container " +
			"targeting a container that mounts a read-only parent or runtime-state path unless it meets that mount's conditions",
		Order: 31, PodCheck: checkNamespaceEntry, PodScopes: []scope{scopePod, scopeTemplate, scopeNewEphemeral},
		Trigger: func(in *CELInput) *CELTrigger {
			return &CELTrigger{Pod: `(has(object.spec.hostPID) && object.spec.hostPID) || ` +
				`(has(object.spec.ephemeralContainers) && object.spec.ephemeralContainers.exists(c, has(c.targetContainerName)))`}
		},
		Gap: "an ephemeral container's target whose host path needs cleaning (`..`, `//`, `./`) is left to the webhook, as sensitive-hostpath leaves it",
		CEL: namespaceEntryCEL,
	})
}

// namespaceEntryCEL: a judged container of a hostPID pod that is not
// unprivileged, or a judged ephemeral container targeting a container that
// mounts a guarded host path without the read-only-parent conditions but
// the mount's own.
func namespaceEntryCEL(in *CELInput) *CELCheck {
	below, parent := sensitiveRelationCEL(in)
	var hostPID []string
	for _, l := range in.JudgedLists {
		hostPID = append(hostPID, fmt.Sprintf(`%s.exists(c, !(%s))`, l, unprivilegedCEL()))
	}
	guarded := fmt.Sprintf(`has(object.spec.volumes) && object.spec.volumes.exists(v, v.name == m.name && has(v.hostPath) && %s && !(%s) && %s)`,
		celexpr.Judgeable("v.hostPath.path"), below, parent)
	var targets []string
	for _, l := range []string{"containers", "initContainers"} {
		targets = append(targets, fmt.Sprintf(`(has(object.spec.%[1]s) && object.spec.%[1]s.exists(t, t.name == c.targetContainerName && has(t.volumeMounts) && t.volumeMounts.exists(m, %[2]s)))`, l, guarded))
	}
	conditions := strings.Join([]string{unprivilegedCEL(), celIDOf("runAsGroup") + ` > 0`, podGroupsCEL(true)}, " && ")
	ephemeral := "false"
	if l := in.JudgedLists[len(in.JudgedLists)-1]; strings.Contains(l, "ephemeralContainers") {
		ephemeral = fmt.Sprintf(`%s.exists(c, has(c.targetContainerName) && (%s) && !(%s))`, l, celexpr.Or(targets...), conditions)
	}
	return &CELCheck{
		Message: "enters another process namespace (hostPID, or an ephemeral container's target that mounts a host path parent or runtime state) as root, with capabilities, escalation or privilege",
		Pod:     fmt.Sprintf(`(has(object.spec.hostPID) && object.spec.hostPID && (%s)) || (%s)`, celexpr.Or(hostPID...), ephemeral),
	}
}
