package policy

import (
	"fmt"
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
//
// Each host path volume falls in one class, judged in a file of its own:
// links of /proc (check_sensitive_hostpath_proc_link.go), paths that expose
// a sensitive path (…_exposed.go), parents and runtime state that need the
// read-only-parent conditions (…_parent.go), and write-protected system
// directories (…_write_protected.go).
func checkSensitiveHostPaths(in *Input) []Finding {
	var out []Finding
	for i := range in.t.spec.Volumes {
		v := &in.t.spec.Volumes[i]
		if v.HostPath == nil {
			continue
		}
		hp := hostPathVolume{volume: v, path: cleanAbsolute(v.HostPath.Path),
			at: in.t.specPath.Child("volumes").Index(i).Child("hostPath", "path").String()}
		if procHostLink.MatchString(hp.path) {
			out = append(out, procLinkHostPath(in, hp)...)
			continue
		}
		reach, below := in.e.guardedRelation(hp.path)
		switch {
		case reach == "":
			out = append(out, writeProtectedHostPath(in, hp)...)
		case below || in.e.policy.Spec.SensitiveHostPathParents == config.ParentsDeny:
			out = append(out, exposedHostPath(in, hp, reach)...)
		default:
			out = append(out, parentHostPath(in, hp, reach)...)
		}
	}
	return out
}

// hostPathVolume is a host path volume of the pod under judgement.
type hostPathVolume struct {
	volume *corev1.Volume
	// path is the host path cleaned, as the runtime sees it.
	path string
	// at is the field path of the host path, for findings.
	at string
}

// denyHostPath denies host path volume hp whatever the containers mounting
// it; on an UPDATE adding ephemeral containers, only where one of them
// mounts it.
func (in *Input) denyHostPath(hp hostPathVolume, format string, args ...any) []Finding {
	if in.scope != scopeNewEphemeral || slices.ContainsFunc(in.containers, func(c containerRef) bool { return mounts(c.c, hp.volume.Name) }) {
		return []Finding{podFinding(RuleSensitiveHostPath, effectDeny, hp.at, format, args...)}
	}
	return nil
}

// guardedRelation finds what a host path at clean path p reaches: the first
// sensitive path it is at or below (below true); else the first sensitive
// path it is a strict parent of; else, unless a writable path or a
// read-only runtime-state path holds p, the first runtime-state tree it is
// at, below or above. "" where none. All but the first need the
// read-only-parent conditions: a runtime's socket, the kubelet's
// credentials and other pods' volumes lie somewhere below.
func (e *Engine) guardedRelation(p string) (what string, below bool) {
	if s, below := e.sensitiveRelation(p); s != "" {
		return s, below
	}
	if e.isWritable(p) || atOrBelowAny(e.readOnlyState, p) {
		return "", false
	}
	if r := firstRelated(e.runtimeState, p); r != "" {
		return r + " (runtime state)", false
	}
	return "", false
}

// isWritable reports whether clean path p is at or below one of the
// policy's writableHostPaths, under any of its names.
func (e *Engine) isWritable(p string) bool { return atOrBelowAny(e.writable, p) }

// atOrBelowAny reports whether clean path p is at or below one of aliased
// (each policy path under its names).
func atOrBelowAny(aliased [][]string, p string) bool {
	return slices.ContainsFunc(aliased, func(aliases []string) bool {
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
// policy's writableHostPaths, scoped or not, under any of their names.
func writableCEL(in *CELInput) string { return atOrBelowCEL(in.Policy.Spec.WritablePaths()) }

// atOrBelowCEL: host path volume v's clean path is at or below one of
// paths, under any of their names; false for none.
func atOrBelowCEL(paths []string) string {
	if len(paths) == 0 {
		return "false"
	}
	return fmt.Sprintf(`%s.exists(w, %[2]s == w || %[2]s.startsWith(w + "/"))`,
		aliasedPathsCEL(paths), celexpr.CleanPath("v.hostPath.path"))
}

// sensitiveRelationCEL are predicates over a host path volume v: its path is
// at or below a sensitive path or through a per-process link of /proc
// (below), or a parent of a sensitive path or, outside the writable and read-only runtime-state paths,
// related to a runtime-state tree (parent): guardedRelation, with every
// path under each of its names.
func sensitiveRelationCEL(in *CELInput) (below, parent string) {
	list := aliasedPathsCEL(in.Policy.Spec.SensitiveHostPaths)
	p := celexpr.CleanPath("v.hostPath.path")
	below = fmt.Sprintf(`(%[2]s.matches(%[3]s) || %[1]s.exists(s, %[2]s == s || %[2]s.startsWith(s + "/")))`, list, p, celexpr.Str(procHostLinkPattern))
	parent = fmt.Sprintf(`%s.exists(s, %[2]s == "/" || s.startsWith(%[2]s + "/"))`, list, p)
	if len(in.Policy.Spec.RuntimeStateHostPaths) > 0 {
		parent = fmt.Sprintf(`(%s || (%s && !%s && !%s))`, parent, relatedCEL(in.Policy.Spec.RuntimeStateHostPaths), writableCEL(in),
			atOrBelowCEL(in.Policy.Spec.ReadOnlyRuntimeStatePaths))
	}
	return below, parent
}

// related reports whether two clean absolute paths are equal or one lies below the other.
func related(a, b string) bool {
	return a == b || a == "/" || b == "/" || strings.HasPrefix(a, b+"/") || strings.HasPrefix(b, a+"/")
}

// mountsVolumeCEL: container c mounts volume v.
const mountsVolumeCEL = `has(c.volumeMounts) && c.volumeMounts.exists(m, m.name == v.name)`

// containerHas: container c's securityContext sets field.
func containerHas(field string) string {
	return "has(c.securityContext) && has(c.securityContext." + field + ")"
}

// podHas: the pod's securityContext sets field.
func podHas(field string) string {
	return "has(object.spec.securityContext) && has(object.spec.securityContext." + field + ")"
}
