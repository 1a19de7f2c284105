package policy

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// parentHostPath is the class of sensitive-hostpath for strict parents of
// a sensitive path, and for paths related to a runtime-state tree (reach
// names which): each container that mounts one must meet the read-only-parent
// conditions (readOnlyParentProblems), with the groups pin-parent-groups
// plans taken as pinned.
func parentHostPath(in *Input, hp hostPathVolume, reach string) []Finding {
	var out []Finding
	for k := range in.containers {
		c := &in.containers[k]
		if !mounts(c.c, hp.volume.Name) {
			continue
		}
		if missing := in.parentProblems(c, hp.volume.Name); len(missing) > 0 {
			out = append(out, containerFinding(RuleSensitiveHostPath, effectDeny, c, hp.at,
				"mounts %s, which reaches %s, without %s; such a mount needs readOnly, a non-root user and group, "+
					"allowPrivilegeEscalation: false, capabilities.drop [ALL] (adding back NET_BIND_SERVICE or SYS_TIME at most) and no privilege",
				quote(hp.volume.HostPath.Path), reach, strings.Join(missing, ", ")))
		}
	}
	return out
}

// parentProblems lists what container c lacks to mount a parent of a
// sensitive path, with the groups gpuguard pins on a new pod taken as pinned
// (pin-parent-groups); none means it may.
func (in *Input) parentProblems(c *containerRef, volume string) []string {
	pod, sc := in.pinned().applied(in.t.spec.SecurityContext, c)
	return readOnlyParentProblems(in.t.spec, c.c, volume, pod, sc, true)
}

// readOnlyParentProblems lists what container c of spec, under the pod's and
// its own security contexts, lacks to mount a parent of a sensitive path; the
// group conditions only where withGroups is set.
func readOnlyParentProblems(spec *corev1.PodSpec, c *corev1.Container, volume string, pod *corev1.PodSecurityContext, sc *corev1.SecurityContext, withGroups bool) []string {
	var missing []string
	// A process namespace shared with the pod's other containers would let
	// a root one among them take this container's user and groups and enter
	// its mounts through /proc/PID/root.
	if spec.ShareProcessNamespace != nil && *spec.ShareProcessNamespace {
		missing = append(missing, "a process namespace of its own")
	}
	if mountsWritable(c, volume) {
		missing = append(missing, "readOnly")
	}
	if sc == nil {
		sc = &corev1.SecurityContext{}
	}
	if !runsAsNonRoot(pod, sc) {
		missing = append(missing, "a non-root user")
	}
	if withGroups {
		missing = append(missing, groupProblems(pod, sc)...)
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		missing = append(missing, "allowPrivilegeEscalation: false")
	}
	if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
		missing = append(missing, "capabilities.drop [ALL]")
	}
	if sc.Capabilities != nil && slices.ContainsFunc(sc.Capabilities.Add, func(a corev1.Capability) bool { return !harmlessCapability(a) }) {
		missing = append(missing, "capabilities.add of NET_BIND_SERVICE or SYS_TIME only")
	}
	if sc.Privileged != nil && *sc.Privileged {
		missing = append(missing, "privileged: false")
	}
	return missing
}

// harmlessCapabilities may be added back to a container that mounts a parent
// of a sensitive path: neither reaches files, sockets or devices. Any other
// could: an added capability stays in the process's permitted set, and a
// file-capability binary in the image takes it up even under no_new_privs
// (DAC_OVERRIDE would open the runtime's socket). kube-prometheus's node
// exporter adds SYS_TIME.
var harmlessCapabilities = []string{"NET_BIND_SERVICE", "SYS_TIME"}

func harmlessCapability(c corev1.Capability) bool {
	return slices.Contains(harmlessCapabilities, capabilityName(c))
}

// runsAsNonRoot: the container's user, or the pod's, is set above 0; or none
// is set and runAsNonRoot (the container's, else the pod's) is true, which the
// kubelet enforces against the image's user.
func runsAsNonRoot(pod *corev1.PodSecurityContext, c *corev1.SecurityContext) bool {
	uid, nonRoot := c.RunAsUser, c.RunAsNonRoot
	if pod != nil {
		if uid == nil {
			uid = pod.RunAsUser
		}
		if nonRoot == nil {
			nonRoot = pod.RunAsNonRoot
		}
	}
	if uid != nil {
		return *uid > 0
	}
	return nonRoot != nil && *nonRoot
}

// groupProblems lists what keeps a container's groups from being known to
// exclude root's: CRI sockets are root:root 0660, so group 0 alone would
// reach them. The primary group must be set above 0 (else it comes from the
// image's /etc/passwd), fsGroup and supplementalGroups must not hold 0, and
// supplementalGroupsPolicy must be Strict (else the image's /etc/group adds
// groups the image's author chose).
func groupProblems(pod *corev1.PodSecurityContext, c *corev1.SecurityContext) []string {
	if pod == nil {
		pod = &corev1.PodSecurityContext{}
	}
	var missing []string
	if gid := effectiveID(pod.RunAsGroup, c.RunAsGroup); gid == nil || *gid <= 0 {
		missing = append(missing, "runAsGroup above 0")
	}
	if rootInGroups(pod) {
		missing = append(missing, "fsGroup and supplementalGroups above 0")
	}
	if pod.SupplementalGroupsPolicy == nil || *pod.SupplementalGroupsPolicy != corev1.SupplementalGroupsPolicyStrict {
		missing = append(missing, "supplementalGroupsPolicy: Strict")
	}
	return missing
}

// effectiveID is the container's user or group ID if set, else the pod's.
func effectiveID(pod, container *int64) *int64 {
	if container != nil {
		return container
	}
	return pod
}

// rootInGroups: the pod's fsGroup or supplementalGroups hold root's group.
func rootInGroups(pod *corev1.PodSecurityContext) bool {
	return (pod.FSGroup != nil && *pod.FSGroup <= 0) || slices.ContainsFunc(pod.SupplementalGroups, func(g int64) bool { return g <= 0 })
}

// readOnlyParentCEL is readOnlyParentProblems finding nothing, over a
// container c mounting volume v.
func readOnlyParentCEL() string {
	return strings.Join([]string{mountsReadOnlyCEL, unprivilegedCEL(), celIDOf("runAsGroup") + ` > 0`, podGroupsCEL(true)}, " && ")
}

// mountsReadOnlyCEL: container c mounts volume v only read-only.
const mountsReadOnlyCEL = `c.volumeMounts.all(m, m.name != v.name || (has(m.readOnly) && m.readOnly))`

// unprivilegedCEL: container c runs as a non-root user, without privilege
// escalation, capabilities or privilege, in a pod that shares no process
// namespace among its containers.
func unprivilegedCEL() string {
	sc := containerHas
	nonRootFlag := fmt.Sprintf(`(%s ? c.securityContext.runAsNonRoot : (%s && object.spec.securityContext.runAsNonRoot))`, sc("runAsNonRoot"), podHas("runAsNonRoot"))
	return strings.Join([]string{
		`!(has(object.spec.shareProcessNamespace) && object.spec.shareProcessNamespace)`,
		fmt.Sprintf(`(%s ? %s > 0 : %s)`, celIDSet("runAsUser"), celIDOf("runAsUser"), nonRootFlag),
		sc("allowPrivilegeEscalation") + ` && !c.securityContext.allowPrivilegeEscalation`,
		sc("capabilities") + ` && has(c.securityContext.capabilities.drop) && "ALL" in c.securityContext.capabilities.drop`,
		`!(has(c.securityContext.capabilities.add) && c.securityContext.capabilities.add.exists(a, !(a.upperAscii() in ` + capabilitiesCEL(harmlessCapabilities) + `)))`,
		`!(` + sc("privileged") + ` && c.securityContext.privileged)`,
	}, " && ")
}

// podGroupsCEL: the pod's fsGroup and supplementalGroups hold no 0 and,
// where strict is set, its supplementalGroupsPolicy is Strict (else unset
// or Strict).
func podGroupsCEL(strict bool) string {
	policy := podHas("supplementalGroupsPolicy") + ` && object.spec.securityContext.supplementalGroupsPolicy == "Strict"`
	if !strict {
		policy = `!(` + podHas("supplementalGroupsPolicy") + ` && object.spec.securityContext.supplementalGroupsPolicy != "Strict")`
	}
	return strings.Join([]string{
		`!(` + podHas("fsGroup") + ` && object.spec.securityContext.fsGroup <= 0)`,
		`!(` + podHas("supplementalGroups") + ` && object.spec.securityContext.supplementalGroups.exists(g, g <= 0))`,
		policy,
	}, " && ")
}

// celIDOf is container c's runAsUser or runAsGroup (field), else the pod's,
// else -1.
func celIDOf(field string) string {
	return fmt.Sprintf(`(%[2]s ? c.securityContext.%[1]s : (%[3]s ? object.spec.securityContext.%[1]s : -1))`,
		field, containerHas(field), podHas(field))
}

// celIDSet: container c's securityContext, or the pod's, sets field.
func celIDSet(field string) string {
	return fmt.Sprintf(`((%s) || %s)`, containerHas(field), podHas(field))
}
