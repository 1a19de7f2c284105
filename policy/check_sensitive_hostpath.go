package policy

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/policy/celexpr"
)

// checkSensitiveHostPaths is the rule sensitive-hostpath: host directories that
// hold device nodes, device plugin sockets, CDI specs or the runtime's
// configuration, what the runtime runs or loads as root, and links of /proc
// that lead anywhere.
//
// Fields read:
//   - spec.volumes[*].hostPath.path;
//   - for a volume related to a write-protected path, in every container
//     that mounts it: volumeMounts[*].readOnly;
//   - for a volume that is a strict parent of a sensitive path, in every
//     container that mounts it: volumeMounts[*].readOnly, securityContext
//     (runAsUser, runAsNonRoot, runAsGroup, allowPrivilegeEscalation,
//     capabilities.drop and .add, privileged), the pod's securityContext
//     (runAsUser, runAsNonRoot, runAsGroup, fsGroup, supplementalGroups,
//     supplementalGroupsPolicy) and spec.shareProcessNamespace.
//
// Allowed values: a path that is neither equal to, below, nor above one of the
// policy's sensitiveHostPaths, nor a per-process link of /proc (PID/root,
// cwd, exe, fd/N, map_files/…, for a PID, self, thread-self or a task of
// one; see procHostLinkPattern). /run and /var/run are treated alike. A path
// at or below a sensitive path, or through such a link, is denied whatever
// the container. A path at, below or above one of the policy's
// writeProtectedHostPaths, and related to no sensitive path, is denied in
// each container that mounts it other than readOnly. A strict parent
// (/, /var, /run, …) is admitted only where every container mounting it
// mounts it readOnly, runs as a non-root user and a group above 0 (runAsGroup
// set, fsGroup and supplementalGroups without 0, supplementalGroupsPolicy
// Strict), sets allowPrivilegeEscalation: false, drops ALL capabilities
// (adding back at most NET_BIND_SERVICE or SYS_TIME), is not privileged and
// shares no process namespace with the pod's other containers; the policy's
// sensitiveHostPathParents: deny denies parents outright. Such a process
// cannot open device nodes (the device cgroup), cannot connect to root-owned
// sockets (connect needs write permission on the socket, which a read-only
// mount does not take away but a user outside root's user and group without
// CAP_DAC_OVERRIDE lacks), and cannot regain either through a setuid or
// file-capability binary. Default action: deny, whatever the action. On an
// UPDATE adding ephemeral containers, their mounts are judged the same way.
func checkSensitiveHostPaths(in *Input) []Finding {
	var out []Finding
	for i, v := range in.t.spec.Volumes {
		if v.HostPath == nil {
			continue
		}
		p := cleanAbsolute(v.HostPath.Path)
		at := in.t.specPath.Child("volumes").Index(i).Child("hostPath", "path").String()
		if procHostLink.MatchString(p) {
			out = append(out, in.denyHostPath(v, at, "%s is a link of /proc that the runtime follows on the host, to the host's root or wherever a process's directory or file is; "+
				"name the host path itself", quote(v.HostPath.Path))...)
			continue
		}
		s, below := in.e.guardedRelation(p)
		if s == "" {
			out = append(out, in.checkWriteProtected(v, p, at)...)
			continue
		}
		if below || in.e.policy.Spec.SensitiveHostPathParents == config.ParentsDeny {
			out = append(out, in.denyHostPath(v, at, "%s exposes %s; use a GPU resource instead", quote(v.HostPath.Path), s)...)
			continue
		}
		for k := range in.containers {
			c := &in.containers[k]
			if !mounts(c.c, v.Name) {
				continue
			}
			if missing := in.parentProblems(c, v.Name); len(missing) > 0 {
				out = append(out, containerFinding(RuleSensitiveHostPath, effectDeny, c, at,
					"mounts %s, which reaches %s, without %s; such a mount needs readOnly, a non-root user and group, "+
						"allowPrivilegeEscalation: false, capabilities.drop [ALL] (adding back NET_BIND_SERVICE or SYS_TIME at most) and no privilege", quote(v.HostPath.Path), s, strings.Join(missing, ", ")))
			}
		}
	}
	return out
}

// procHostLinkPattern matches a host path through a per-process link of
// /proc: a process's root, working directory, executable, open files and
// mapped files, of any process (a PID, self, thread-self, or a task of one).
// The kubelet passes a hostPath through as written; containerd resolves one
// that ends in a link on the host before it bind-mounts it (WithMounts, with
// the host's view of /proc), and the runtime looks up one through a link as
// root on the host. So /proc/1/root is the host's root, and the others lead
// wherever that process's directory or file is: no list of sensitive paths
// can judge them. The same text is the CEL backstop's (RE2).
const procHostLinkPattern = `^/proc/([0-9]+|self|thread-self)(/task/[0-9]+)?/(root|cwd|exe|fd|map_files)(/|$)`

var procHostLink = regexp.MustCompile(procHostLinkPattern)

// denyHostPath denies host path volume v whatever the containers mounting
// it; on an UPDATE adding ephemeral containers, only where one of them
// mounts it.
func (in *Input) denyHostPath(v corev1.Volume, at, format string, args ...any) []Finding {
	if in.scope != scopeNewEphemeral || slices.ContainsFunc(in.containers, func(c containerRef) bool { return mounts(c.c, v.Name) }) {
		return []Finding{podFinding(RuleSensitiveHostPath, effectDeny, at, format, args...)}
	}
	return nil
}

// checkWriteProtected denies each container that mounts host path volume v,
// at clean path p, other than readOnly where p is at, below or above one of
// the policy's writeProtectedHostPaths.
func (in *Input) checkWriteProtected(v corev1.Volume, p, at string) []Finding {
	w := in.e.writeProtectedRelation(p)
	if w == "" {
		return nil
	}
	var out []Finding
	for k := range in.containers {
		c := &in.containers[k]
		if mountsWritable(c.c, v.Name) {
			out = append(out, containerFinding(RuleSensitiveHostPath, effectDeny, c, at,
				"mounts %s read-write, which is, holds or lies in the system directory %s, whose files the node runs, loads or trusts as root; "+
					"mount it readOnly, or use a data directory (writableHostPaths)", quote(v.HostPath.Path), w))
		}
	}
	return out
}

// writeProtectedRelation finds the first write-protected path p is at,
// below or above, or "" where there is none or a writable path holds p.
func (e *Engine) writeProtectedRelation(p string) string {
	if e.isWritable(p) {
		return ""
	}
	return firstRelated(e.writeProtected, p)
}

// guardedRelation finds what a host path at clean path p reaches: the first
// sensitive path it is at or below (below true); else the first sensitive
// path it is a strict parent of; else, unless a writable path holds p, the
// first runtime-state tree it is at, below or above. "" where none. All but
// the first need the read-only-parent conditions: a runtime's socket, the
// kubelet's credentials and other pods' volumes lie somewhere below.
func (e *Engine) guardedRelation(p string) (what string, below bool) {
	if s, below := e.sensitiveRelation(p); s != "" {
		return s, below
	}
	if e.isWritable(p) {
		return "", false
	}
	if r := firstRelated(e.runtimeState, p); r != "" {
		return r + " (runtime state)", false
	}
	return "", false
}

// isWritable reports whether clean path p is at or below one of the
// policy's writableHostPaths, under any of its names.
func (e *Engine) isWritable(p string) bool {
	return slices.ContainsFunc(e.writable, func(aliases []string) bool {
		return slices.ContainsFunc(aliases, func(w string) bool { return p == w || strings.HasPrefix(p, w+"/") })
	})
}

// firstRelated returns the first path of aliased (each policy path under
// its names) that clean path p is at, below or above, under the name that
// matched, so that a message names what the pod wrote; "" for none.
func firstRelated(aliased [][]string, p string) string {
	for _, aliases := range aliased {
		if k := slices.IndexFunc(aliases, func(w string) bool { return related(p, w) }); k >= 0 {
			return aliases[k]
		}
	}
	return ""
}

// mountsWritable reports whether container c mounts the named volume other
// than readOnly.
func mountsWritable(c *corev1.Container, volume string) bool {
	return slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == volume && !m.ReadOnly })
}

// sensitiveRelation finds the first sensitive path p is related to: below
// is true when p is at or below it, false when p is a strict parent of it.
func (e *Engine) sensitiveRelation(p string) (sensitive string, below bool) {
	var parentOf string
	for k, aliases := range e.sensitiveHostPaths {
		for _, s := range aliases {
			switch {
			case p == s || strings.HasPrefix(p, s+"/"):
				return e.policy.Spec.SensitiveHostPaths[k], true
			case parentOf == "" && (p == "/" || strings.HasPrefix(s, p+"/")):
				parentOf = e.policy.Spec.SensitiveHostPaths[k]
			}
		}
	}
	return parentOf, false
}

// mounts reports whether container c mounts the named volume.
func mounts(c *corev1.Container, volume string) bool {
	return slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == volume })
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

// hostLinks are directories that are links to others on the nodes gpuguard
// guards: /var/run to /run everywhere, and on merged-/usr systems (Debian
// 12, Ubuntu 20.04 and later, RHEL 9, Fedora, Arch) /bin, /sbin and /lib*
// to their /usr twins. The kubelet passes a hostPath through as written and
// the runtime resolves links on the host, so a path under one is the path
// under the other; on a system where they are directories of their own,
// treating them alike only guards a path more.
var hostLinks = [][2]string{
	{"/var/run", "/run"},
	{"/bin", "/usr/bin"}, {"/sbin", "/usr/sbin"},
	{"/lib", "/usr/lib"}, {"/lib32", "/usr/lib32"}, {"/lib64", "/usr/lib64"}, {"/libx32", "/usr/libx32"},
}

// HostAliases cleans a path and lists it under every name hostLinks give it,
// itself first, so that a host path is compared with each spelling.
func HostAliases(p string) []string {
	p = cleanAbsolute(p)
	out := []string{p}
	for _, l := range hostLinks {
		for _, from := range []int{0, 1} {
			link, target := l[from], l[1-from]
			if p == link || strings.HasPrefix(p, link+"/") {
				out = append(out, target+strings.TrimPrefix(p, link))
			}
		}
	}
	return out
}

// aliasedPathsCEL is a CEL list of the paths under each of their spellings
// (HostAliases), sorted, without duplicates or paths below another.
func aliasedPathsCEL(paths []string) string {
	var all []string
	for _, p := range paths {
		all = append(all, HostAliases(p)...)
	}
	slices.Sort(all)
	return celexpr.List(withoutDescendants(slices.Compact(all)))
}

// withoutDescendants drops from sorted clean paths each one that lies below
// another: for every relation the host path rules test (at, below, above),
// a path below a listed one adds nothing, since the ancestors of a path are
// ordered. The CEL then scans shorter lists.
func withoutDescendants(sorted []string) []string {
	var out []string
	for _, p := range sorted {
		if !slices.ContainsFunc(out, func(a string) bool { return a == "/" || strings.HasPrefix(p, a+"/") }) {
			out = append(out, p)
		}
	}
	return out
}

// aliasesOf lists each path's spellings (HostAliases), in the paths' order.
func aliasesOf(paths []string) [][]string {
	var out [][]string
	for _, p := range paths {
		out = append(out, HostAliases(p))
	}
	return out
}

// RuleSensitiveHostPath is the rule of checkSensitiveHostPaths.
const RuleSensitiveHostPath RuleID = "sensitive-hostpath"

func init() {
	register(&Rule{
		ID:      RuleSensitiveHostPath,
		Summary: "hostPath volumes at or below sensitive paths or through a per-process link of /proc; their parents unless mounted read-only by non-root containers without privilege; write-protected paths other than read-only",
		Order:   30, PodCheck: checkSensitiveHostPaths, PodScopes: []scope{scopePod, scopeTemplate, scopeNewEphemeral},
		// Any host path: a parent of a sensitive path is one too, and paths
		// CEL cannot clean are left to the webhook.
		Trigger: func(in *CELInput) *CELTrigger {
			return &CELTrigger{Pod: hostPathTrigger}
		},
		Gap: "host paths that need cleaning (`..`, `//`, `./`): CEL has no `path.Clean`, so they are left to the webhook rather than judged wrongly",
		CEL: sensitiveHostPathCEL,
	})
}

// sensitiveHostPathCEL: a hostPath at or below a sensitive path (on CREATE;
// on an ephemeral-container UPDATE, one a new container mounts), or a parent
// that a judged container mounts without the conditions, with /run and
// /var/run alike, for paths CEL can judge.
func sensitiveHostPathCEL(in *CELInput) *CELCheck {
	below, parent := sensitiveRelationCEL(in)
	var mounting, unsafe []string
	for _, l := range in.JudgedLists {
		m := fmt.Sprintf(`%s.exists(c, %s`, l, mountsVolumeCEL)
		mounting = append(mounting, m+")")
		unsafe = append(unsafe, m+" && !("+readOnlyParentCEL()+"))")
	}
	if in.Policy.Spec.SensitiveHostPathParents == config.ParentsDeny {
		below = "(" + below + " || " + parent + ")"
		parent = "false"
	}
	return &CELCheck{Message: "mounts a host path that exposes devices or the NVIDIA runtime's configuration, or a parent of one other than read-only, as non-root, without privilege, " +
		"or a write-protected host path other than read-only",
		Pod: fmt.Sprintf(`has(object.spec.volumes) && object.spec.volumes.exists(v, has(v.hostPath) && %[1]s && `+
			`(%[2]s ? (request.operation == "CREATE" || %[3]s) : (%[4]s ? (%[5]s) : %[6]s)))`,
			celexpr.Judgeable("v.hostPath.path"), below, celexpr.Or(mounting...), parent, celexpr.Or(unsafe...), writeProtectedCEL(in))}
}

// writeProtectedCEL: host path volume v is at, below or above one of the
// policy's writeProtectedHostPaths (with /run and /var/run alike), and a
// judged container mounts it other than read-only.
func writeProtectedCEL(in *CELInput) string {
	if len(in.Policy.Spec.WriteProtectedHostPaths) == 0 {
		return "false"
	}
	related := relatedCEL(in.Policy.Spec.WriteProtectedHostPaths)
	var writable []string
	for _, l := range in.JudgedLists {
		writable = append(writable, fmt.Sprintf(`%s.exists(c, %s && !(%s))`, l, mountsVolumeCEL, mountsReadOnlyCEL))
	}
	return "(" + related + " && !" + writableCEL(in) + " && (" + celexpr.Or(writable...) + "))"
}

// relatedCEL: host path volume v's clean path is at, below or above one of
// paths, under any of their names; false for none.
func relatedCEL(paths []string) string {
	if len(paths) == 0 {
		return "false"
	}
	return fmt.Sprintf(`%s.exists(w, %[2]s == w || %[2]s == "/" || %[2]s.startsWith(w + "/") || w.startsWith(%[2]s + "/"))`,
		aliasedPathsCEL(paths), celexpr.CleanPath("v.hostPath.path"))
}

// writableCEL: host path volume v's clean path is at or below one of the
// policy's writableHostPaths, under any of their names.
func writableCEL(in *CELInput) string {
	if len(in.Policy.Spec.WritableHostPaths) == 0 {
		return "false"
	}
	return fmt.Sprintf(`%s.exists(w, %[2]s == w || %[2]s.startsWith(w + "/"))`,
		aliasedPathsCEL(in.Policy.Spec.WritableHostPaths), celexpr.CleanPath("v.hostPath.path"))
}

// sensitiveRelationCEL are predicates over a host path volume v: its path is
// at or below a sensitive path or through a per-process link of /proc
// (below), or a parent of a sensitive path or, outside the writable paths,
// related to a runtime-state tree (parent): guardedRelation, with every
// path under each of its names.
func sensitiveRelationCEL(in *CELInput) (below, parent string) {
	list := aliasedPathsCEL(in.Policy.Spec.SensitiveHostPaths)
	p := celexpr.CleanPath("v.hostPath.path")
	below = fmt.Sprintf(`(%[2]s.matches(%[3]s) || %[1]s.exists(s, %[2]s == s || %[2]s.startsWith(s + "/")))`, list, p, celexpr.Str(procHostLinkPattern))
	parent = fmt.Sprintf(`%s.exists(s, %[2]s == "/" || s.startsWith(%[2]s + "/"))`, list, p)
	if len(in.Policy.Spec.RuntimeStateHostPaths) > 0 {
		parent = fmt.Sprintf(`(%s || (%s && !%s))`, parent, relatedCEL(in.Policy.Spec.RuntimeStateHostPaths), writableCEL(in))
	}
	return below, parent
}

// related reports whether two clean absolute paths are equal or one lies below the other.
func related(a, b string) bool {
	return a == b || a == "/" || b == "/" || strings.HasPrefix(a, b+"/") || strings.HasPrefix(b, a+"/")
}

// readOnlyParentCEL is readOnlyParentProblems finding nothing, over a
// container c mounting volume v.
func readOnlyParentCEL() string {
	return strings.Join([]string{mountsReadOnlyCEL, unprivilegedCEL(), celIDOf("runAsGroup") + ` > 0`, podGroupsCEL(true)}, " && ")
}

// mountsVolumeCEL: container c mounts volume v.
const mountsVolumeCEL = `has(c.volumeMounts) && c.volumeMounts.exists(m, m.name == v.name)`

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

// containerHas: container c's securityContext sets field.
func containerHas(field string) string {
	return "has(c.securityContext) && has(c.securityContext." + field + ")"
}

// podHas: the pod's securityContext sets field.
func podHas(field string) string {
	return "has(object.spec.securityContext) && has(object.spec.securityContext." + field + ")"
}
