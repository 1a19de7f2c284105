package policy

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuguard/gpuguard/policy/celexpr"
)

// writeProtectedHostPath is the class of sensitive-hostpath for host paths
// at, below or above one of the policy's writeProtectedHostPaths, outside
// its writableHostPaths: each container that mounts one other than readOnly
// is denied.
func writeProtectedHostPath(in *Input, hp hostPathVolume) []Finding {
	w := in.e.writeProtectedRelation(hp.path)
	owned := ""
	if w == "" {
		if owned = in.othersDataDirectory(hp.path); owned == "" {
			return nil
		}
	}
	var out []Finding
	for k := range in.containers {
		c := &in.containers[k]
		if !mountsWritable(c.c, hp.volume.Name) {
			continue
		}
		if owned != "" {
			out = append(out, containerFinding(RuleSensitiveHostPath, effectDeny, c, hp.at,
				"mounts %s read-write, which lies in the data directory %s, whose writableHostPaths entry lets only its owners' service accounts write it "+
					"(node software consumes what is there as root); mount it readOnly", quote(hp.volume.HostPath.Path), owned))
			continue
		}
		out = append(out, containerFinding(RuleSensitiveHostPath, effectDeny, c, hp.at,
			"mounts %s read-write, which is, holds or lies in the system directory %s, whose files the node runs, loads or trusts as root; "+
				"mount it readOnly, or use a data directory (writableHostPaths)", quote(hp.volume.HostPath.Path), w))
	}
	return out
}

// othersDataDirectory finds the first scoped writableHostPaths entry that
// clean path p is at or below and whose scope leaves this pod out, under the
// name that matched; "" where there is none, or where an entry that admits
// the pod holds p as well. A scope admits only the pod's own service
// account's doing: not an ephemeral container its requester adds.
func (in *Input) othersDataDirectory(p string) string {
	ns, sa, byOwner := in.namespace, serviceAccountOf(in.t.spec), !writtenByRequester(in.req, in.t)
	first := ""
	for k, aliases := range in.e.writable {
		i := slices.IndexFunc(aliases, func(w string) bool { return p == w || strings.HasPrefix(p, w+"/") })
		if i < 0 {
			continue
		}
		entry := in.e.policy.Spec.WritableHostPaths[k]
		if !entry.Scoped() || byOwner && entry.Admits(ns, sa) {
			return ""
		}
		if first == "" {
			first = aliases[i]
		}
	}
	return first
}

// writeProtectedRelation finds the first write-protected path p is at,
// below or above, or "" where there is none or a writable path holds p.
func (e *Engine) writeProtectedRelation(p string) string {
	if e.isWritable(p) {
		return ""
	}
	return firstRelated(e.writeProtected, p)
}

// mountsWritable reports whether container c mounts the named volume other
// than readOnly.
func mountsWritable(c *corev1.Container, volume string) bool {
	return slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == volume && !m.ReadOnly })
}

// writeProtectedCEL: host path volume v is at, below or above one of the
// policy's writeProtectedHostPaths (with /run and /var/run alike) outside
// its writableHostPaths, or lies in a scoped data directory that admits no
// pod like this one (othersDataDirectory), and a judged container mounts it
// other than read-only.
func writeProtectedCEL(in *CELInput) string {
	var protected []string
	if len(in.Policy.Spec.WriteProtectedHostPaths) > 0 {
		protected = append(protected, "("+relatedCEL(in.Policy.Spec.WriteProtectedHostPaths)+" && !"+writableCEL(in)+")")
	}
	if others := othersDataDirectoryCEL(in); others != "" {
		protected = append(protected, others)
	}
	if len(protected) == 0 {
		return "false"
	}
	var writable []string
	for _, l := range in.JudgedLists {
		writable = append(writable, fmt.Sprintf(`%s.exists(c, %s && !(%s))`, l, mountsVolumeCEL, mountsReadOnlyCEL))
	}
	// Or joins its terms unparenthesized: && would bind tighter than ||.
	return "((" + celexpr.Or(protected...) + ") && (" + celexpr.Or(writable...) + "))"
}

// othersDataDirectoryCEL: host path volume v lies in a scoped data
// directory, and in none that admits the pod (on CREATE, by its namespace or
// its namespace and service account); "" where the policy scopes none.
func othersDataDirectoryCEL(in *CELInput) string {
	p := celexpr.CleanPath("v.hostPath.path")
	holds := func(paths ...string) string {
		return fmt.Sprintf(`%s.exists(w, %[2]s == w || %[2]s.startsWith(w + "/"))`, aliasedPathsCEL(paths), p)
	}
	var scoped, admitted, open []string
	for _, e := range in.Policy.Spec.WritableHostPaths {
		if !e.Scoped() {
			open = append(open, e.Path)
			continue
		}
		scoped = append(scoped, e.Path)
		var owners []string
		for _, sa := range e.ServiceAccounts {
			owners = append(owners, sa.Namespace+"/"+sa.Name)
		}
		admitted = append(admitted, fmt.Sprintf(`(%s && (request.namespace in %s || %s in %s))`,
			holds(e.Path), celexpr.List(e.Namespaces), podServiceAccountCEL, celexpr.List(owners)))
	}
	if len(scoped) == 0 {
		return ""
	}
	owned := `(request.operation == "CREATE" && (` + celexpr.Or(admitted...) + `))`
	if len(open) > 0 {
		owned = "(" + holds(open...) + " || " + owned + ")"
	}
	return "(" + holds(scoped...) + " && !" + owned + ")"
}

// podServiceAccountCEL is the request's namespace/service account of the
// pod, defaulted as the API server defaults it (serviceAccountOf).
const podServiceAccountCEL = `(request.namespace + "/" + (has(object.spec.serviceAccountName) && object.spec.serviceAccountName != "" ? ` +
	`object.spec.serviceAccountName : (has(object.spec.serviceAccount) && object.spec.serviceAccount != "" ? object.spec.serviceAccount : "default")))`
