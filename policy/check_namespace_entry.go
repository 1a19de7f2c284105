package policy

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuguard/gpuguard/policy/celexpr"
)

// checkNamespaceEntry is the rule namespace-entry: containers that can enter
// another process's mount namespace through /proc/PID/root, and so reach
// what that process mounts.
//
// Fields read: spec.hostPID; the host path volumes each judged container
// mounts; spec.ephemeralContainers[*].targetContainerName and the target's
// volumeMounts, with the host path volumes they name; in each entering
// container, what sensitive-hostpath reads of a container mounting a parent.
//
// Allowed values:
//   - hostPID: true only where every container runs as a non-root user,
//     without privilege escalation, with every capability dropped (adding
//     back NET_BIND_SERVICE or SYS_TIME at most) and without privilege. A
//     root process that sees the node's processes opens /proc/1/root, the
//     host's root, and the runtime's socket below it; a process of another
//     user cannot without CAP_SYS_PTRACE, and cannot change its user
//     without CAP_SETUID.
//   - a host path of the node's /proc, or of a process's directory in it
//     (/proc/1, /proc/self, /proc/thread-self and anything below one;
//     procViewPattern): on the same conditions as hostPID, which it is in
//     all but name. Through the mounted /proc a root process, or one with
//     CAP_SYS_PTRACE, opens /proc/1/root as hostPID lets it. The links that
//     the runtime itself follows on the host (/proc/1/root) are left to
//     sensitive-hostpath, which denies them whatever the container.
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
		} else if at, path := in.processViewMount(c); at != "" {
			if missing := in.entryProblems(c, false); len(missing) > 0 {
				out = append(out, containerFinding(RuleNamespaceEntry, effectDeny, c, at,
					"mounts the node's %s, a view of its processes as hostPID gives, without %s; as root or with SYS_PTRACE it enters the host's filesystem through /proc/1/root",
					quote(path), strings.Join(missing, ", ")))
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
		if processView(p) {
			return fmt.Sprintf("%s (a view of the node's processes)", quote(v.HostPath.Path))
		}
		if s, below := in.e.guardedRelation(p); s != "" && !below {
			return fmt.Sprintf("%s (reaching %s)", quote(v.HostPath.Path), s)
		}
	}
	return ""
}

// procViewPattern matches a cleaned host path that shows the node's
// processes: its /proc, or a process's directory there (a PID, self,
// thread-self) and anything below it. The same text is the CEL backstop's
// (RE2).
const procViewPattern = `^/proc(/([0-9]+|self|thread-self)(/.*)?)?$`

var procView = regexp.MustCompile(procViewPattern)

// processView reports whether the cleaned host path p shows the node's
// processes, other than through a link the runtime follows on the host
// (procHostLinkPattern, which sensitive-hostpath denies outright).
func processView(p string) bool {
	return procView.MatchString(p) && !procHostLink.MatchString(p)
}

// processViewMount is the field path and the path of the first host path
// volume that container c mounts and that shows the node's processes, or "".
func (in *Input) processViewMount(c *containerRef) (at, path string) {
	for i, v := range in.t.spec.Volumes {
		if v.HostPath != nil && mounts(c.c, v.Name) && processView(cleanAbsolute(v.HostPath.Path)) {
			return in.t.specPath.Child("volumes").Index(i).Child("hostPath", "path").String(), v.HostPath.Path
		}
	}
	return "", ""
}

// seesNodeProcesses reports whether a container of the pod can see the
// node's processes: hostPID, or a host path volume that shows them.
func (in *Input) seesNodeProcesses() bool {
	return in.t.spec.HostPID || slices.ContainsFunc(in.t.spec.Volumes, func(v corev1.Volume) bool {
		return v.HostPath != nil && processView(cleanAbsolute(v.HostPath.Path))
	})
}

// processViewCEL holds for a host path volume v that shows the node's
// processes (paths CEL can clean only).
func processViewCEL() string {
	p := celexpr.CleanPath("v.hostPath.path")
	return fmt.Sprintf(`(has(v.hostPath) && %s && %s.matches(%s) && !%[2]s.matches(%[4]s))`,
		celexpr.Judgeable("v.hostPath.path"), p, celexpr.Str(procViewPattern), celexpr.Str(procHostLinkPattern))
}

// seesNodeProcessesCEL is seesNodeProcesses over the object.
func seesNodeProcessesCEL() string {
	return `((has(object.spec.hostPID) && object.spec.hostPID) || (has(object.spec.volumes) && object.spec.volumes.exists(v, ` + processViewCEL() + `)))`
}

// RuleNamespaceEntry is the rule of checkNamespaceEntry.
const RuleNamespaceEntry RuleID = "namespace-entry"

func init() {
	register(&Rule{
		ID: RuleNamespaceEntry,
		Summary: "`hostPID`, or a host path of `/proc` or a process's directory in it (`/proc/1`, `/proc/self`), unless every container " +
			"(every one mounting it) is non-root without capabilities, escalation or privilege; an ephemeral container " +
			"targeting a container that mounts such a path, a read-only parent or runtime-state path unless it meets that mount's conditions",
		Order: 31, PodCheck: checkNamespaceEntry, PodScopes: []scope{scopePod, scopeTemplate, scopeNewEphemeral},
		Trigger: func(in *CELInput) *CELTrigger {
			// Any host path that may be /proc once cleaned.
			return &CELTrigger{Pod: `(has(object.spec.hostPID) && object.spec.hostPID) || ` +
				`(has(object.spec.ephemeralContainers) && object.spec.ephemeralContainers.exists(c, has(c.targetContainerName))) || ` +
				`(has(object.spec.volumes) && object.spec.volumes.exists(v, has(v.hostPath) && (!(` + celexpr.Judgeable("v.hostPath.path") + `) || ` +
				celexpr.CleanPath("v.hostPath.path") + `.startsWith("/proc"))))`}
		},
		Gap: "a host path that needs cleaning (`..`, `//`, `./`), mounted or an ephemeral container's target's, is left to the webhook, as sensitive-hostpath leaves it",
		CEL: namespaceEntryCEL,
	})
}

// namespaceEntryCEL: a judged container of a hostPID pod that is not
// unprivileged, or a judged ephemeral container targeting a container that
// mounts a guarded host path without the read-only-parent conditions but
// the mount's own.
func namespaceEntryCEL(in *CELInput) *CELCheck {
	below, parent := sensitiveRelationCEL(in)
	var hostPID, procMounts []string
	procMount := `has(c.volumeMounts) && has(object.spec.volumes) && object.spec.volumes.exists(v, ` + processViewCEL() + ` && c.volumeMounts.exists(m, m.name == v.name))`
	for _, l := range in.JudgedLists {
		hostPID = append(hostPID, fmt.Sprintf(`%s.exists(c, !(%s))`, l, unprivilegedCEL()))
		procMounts = append(procMounts, fmt.Sprintf(`%s.exists(c, (%s) && !(%s))`, l, procMount, unprivilegedCEL()))
	}
	guarded := fmt.Sprintf(`has(object.spec.volumes) && object.spec.volumes.exists(v, v.name == m.name && has(v.hostPath) && ((%s && !(%s) && %s) || %s))`,
		celexpr.Judgeable("v.hostPath.path"), below, parent, processViewCEL())
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
		Message: "enters another process namespace (hostPID, a host path of /proc, or an ephemeral container's target that mounts one, a host path parent or runtime state) as root, with capabilities, escalation or privilege",
		Pod:     fmt.Sprintf(`(has(object.spec.hostPID) && object.spec.hostPID && (%s)) || (%s) || (%s)`, celexpr.Or(hostPID...), celexpr.Or(procMounts...), ephemeral),
	}
}
