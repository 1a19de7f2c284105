package policy

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gpuguard/gpuguard/policy/celexpr"
)

// checkHostPathLinks is the rule hostpath-link: host paths that the node
// would resolve through a link a pod may have planted. The kubelet passes a
// hostPath through as written and the runtime follows links on the host
// when it bind-mounts it, each time it starts a container; so a path below
// a directory that a pod can write leads wherever a link planted there
// points (the runtime's socket, /etc/cdi, static pod manifests), whatever
// the other host path rules made of the path as written.
//
// Fields read:
//   - spec.volumes[*].hostPath.path;
//   - in every container of the pod (init, regular, ephemeral):
//     volumeMounts[*].name and .readOnly.
//
// Allowed values: a host path that lies strictly below neither another host
// path volume of the same pod that a container of the pod (an ephemeral one
// included) mounts other than readOnly, nor one of the policy's
// writableHostPaths (data directories any pod, or any pod of the entry's
// scope, may write), unless the policy names the path itself, in
// writableHostPaths or writeProtectedHostPaths. A data directory may be
// mounted at itself: a pod cannot replace the directory it was given, only
// what lies in it. Paths are compared under every name hostLinks give them
// (/var/run and /run alike). Default action: deny, whatever the action. On
// an UPDATE adding ephemeral containers, a pair is denied where a new
// container mounts either volume (a restarted container mounts its host
// paths again), a path below a data directory where a new container mounts
// it.
//
// What admission cannot see is left to the node: a link planted by one pod
// at a path the policy names, or below a directory that no list names, and
// mounted by a later pod (docs/threat-model.md).
func checkHostPathLinks(in *Input) []Finding {
	var out []Finding
	spec := in.t.spec
	var all []containerRef
	for i := range spec.Volumes {
		v := &spec.Volumes[i]
		if v.HostPath == nil {
			continue
		}
		p := cleanAbsolute(v.HostPath.Path)
		at := in.t.specPath.Child("volumes").Index(i).Child("hostPath", "path").String()
		if root := in.e.dataRootAbove(p); root != "" && in.judgesVolume(v.Name) {
			out = append(out, podFinding(RuleHostPathLink, effectDeny, at,
				"%s lies below the data directory %s, where a pod may have planted a link that the node follows; "+
					"mount %s itself, or name the path in the policy (writableHostPaths, writeProtectedHostPaths)", quote(v.HostPath.Path), root, root))
			continue
		}
		for j := range spec.Volumes {
			w := &spec.Volumes[j]
			if w.HostPath == nil || !belowAliased(p, cleanAbsolute(w.HostPath.Path)) {
				continue
			}
			if all == nil {
				all = in.e.containersOf(spec, in.t.specPath)
			}
			k := slices.IndexFunc(all, func(c containerRef) bool { return mountsWritable(c.c, w.Name) })
			if k < 0 || !in.judgesVolume(v.Name) && !in.judgesVolume(w.Name) {
				continue
			}
			out = append(out, podFinding(RuleHostPathLink, effectDeny, at,
				"%s lies below %s, which container %s mounts read-write: a link it plants there would lead the node's mount anywhere; "+
					"mount one volume and use subPath, or mount %s readOnly", quote(v.HostPath.Path), quote(w.HostPath.Path), all[k].c.Name, quote(w.HostPath.Path)))
			break
		}
	}
	return out
}

// judgesVolume says whether a finding on the named volume is this
// request's: always on CREATE; on an UPDATE adding ephemeral containers,
// where one of them mounts it.
func (in *Input) judgesVolume(name string) bool {
	return in.scope != scopeNewEphemeral || slices.ContainsFunc(in.containers, func(c containerRef) bool { return mounts(c.c, name) })
}

// dataRootAbove is the first of the policy's writableHostPaths that clean
// path p lies strictly below, under the name that matched, unless the policy
// names p itself (writableHostPaths, writeProtectedHostPaths); "" for none.
func (e *Engine) dataRootAbove(p string) string {
	if slices.Contains(e.named, p) {
		return ""
	}
	for _, aliases := range e.writable {
		if k := slices.IndexFunc(aliases, func(w string) bool { return strings.HasPrefix(p, w+"/") }); k >= 0 {
			return aliases[k]
		}
	}
	return ""
}

// belowAliased reports whether clean path p lies strictly below clean path
// q under any of their names (HostAliases).
func belowAliased(p, q string) bool {
	for _, a := range HostAliases(p) {
		for _, b := range HostAliases(q) {
			if a != b && (b == "/" || strings.HasPrefix(a, b+"/")) {
				return true
			}
		}
	}
	return false
}

// namedPaths lists every spelling of the paths the policy names as data or
// system directories: a path among them is no stranger below a data
// directory.
func namedPaths(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		for _, p := range l {
			out = append(out, HostAliases(p)...)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// RuleHostPathLink is the rule of checkHostPathLinks.
const RuleHostPathLink RuleID = "hostpath-link"

func init() {
	register(&Rule{
		ID:      RuleHostPathLink,
		Summary: "hostPath volumes below another host path the pod mounts read-write, or strictly below a writable data directory the policy does not name them in: the node would follow a planted link",
		Order:   34, PodCheck: checkHostPathLinks, PodScopes: []scope{scopePod, scopeTemplate, scopeNewEphemeral},
		// What exempts a workload from the host path rules exempts it from
		// this one: both judge its host paths.
		WaivedWith: RuleSensitiveHostPath,
		Trigger: func(in *CELInput) *CELTrigger {
			return &CELTrigger{Pod: hostPathTrigger}
		},
		Gap: "host paths that need cleaning (`..`, `//`, `./`), as for sensitive-hostpath",
		CEL: hostPathLinkCEL,
	})
}

// hostPathLinkCEL: a host path volume v lies strictly below a writable data
// directory without being named, or strictly below another host path volume
// w that a container of the pod mounts other than read-only; on an
// ephemeral-container UPDATE, where a new container mounts v (or w).
func hostPathLinkCEL(in *CELInput) *CELCheck {
	p := celexpr.CleanPath("v.hostPath.path")
	q := celexpr.CleanPath("w.hostPath.path")
	var mountsV, mountsW []string
	for _, l := range in.JudgedLists {
		mountsV = append(mountsV, fmt.Sprintf(`%s.exists(c, %s)`, l, mountsVolumeCEL))
		mountsW = append(mountsW, fmt.Sprintf(`%s.exists(c, %s)`, l, strings.ReplaceAll(mountsVolumeCEL, "v.name", "w.name")))
	}
	judgedV := `(request.operation == "CREATE" || ` + celexpr.Or(mountsV...) + `)`
	dataRoot := "false"
	if s := in.Policy.Spec; len(s.WritableHostPaths) > 0 {
		dataRoot = fmt.Sprintf(`(%s.exists(r, %s.startsWith(r + "/")) && !(%[2]s in %s) && %s)`,
			aliasedPathsCEL(s.WritablePaths()), p, celexpr.List(namedPaths(s.WritablePaths(), s.WriteProtectedHostPaths)), judgedV)
	}
	var writers []string
	for _, l := range []string{"object.spec.containers", "object.spec.initContainers", "object.spec.ephemeralContainers"} {
		field := strings.TrimPrefix(l, "object.spec.")
		w := fmt.Sprintf(`%s.exists(c, has(c.volumeMounts) && c.volumeMounts.exists(m, m.name == w.name && !(has(m.readOnly) && m.readOnly)))`, l)
		if field != "containers" {
			w = "(has(object.spec." + field + ") && " + w + ")"
		}
		writers = append(writers, w)
	}
	pair := fmt.Sprintf(`object.spec.volumes.exists(w, has(w.hostPath) && %s && %s && (%s) && (request.operation == "CREATE" || %s || %s))`,
		celexpr.Judgeable("w.hostPath.path"), belowAliasedCEL(p, q), celexpr.Or(writers...), celexpr.Or(mountsV...), celexpr.Or(mountsW...))
	return &CELCheck{Message: "mounts a host path below a data directory, or below another host path the pod mounts read-write: the node would follow a link planted there",
		Pod: fmt.Sprintf(`has(object.spec.volumes) && object.spec.volumes.exists(v, has(v.hostPath) && %s && (%s || %s))`,
			celexpr.Judgeable("v.hostPath.path"), dataRoot, pair)}
}

// belowAliasedCEL is belowAliased over CEL strings p and q: each path has at
// most one other name (aliasCEL). Each is bound once, so that the cleaning
// is not repeated in every comparison.
func belowAliasedCEL(p, q string) string {
	return fmt.Sprintf(`[%s].exists(x, [%s].exists(y, [x, %s].exists(a, [y, %s].exists(b, a != b && (b == "/" || a.startsWith(b + "/"))))))`,
		p, q, aliasCEL("x"), aliasCEL("y"))
}

// aliasCEL is CEL string p under its other name (HostAliases), or p itself
// where it has none.
func aliasCEL(p string) string {
	out := p
	for i := len(hostLinks) - 1; i >= 0; i-- {
		for _, from := range []int{1, 0} {
			link, target := hostLinks[i][from], hostLinks[i][1-from]
			out = fmt.Sprintf(`(%[1]s == %[2]s || %[1]s.startsWith(%[3]s) ? %[4]s + %[1]s.substring(%[5]d) : %[6]s)`,
				p, celexpr.Str(link), celexpr.Str(link+"/"), celexpr.Str(target), len(link), out)
		}
	}
	return out
}
