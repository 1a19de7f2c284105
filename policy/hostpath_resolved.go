package policy

import "strings"

// ResolvedHostPathReach says which of the host path rules' classes a host
// path that the node resolved (every link on the host followed) reaches, as
// words for a reason: at or below a sensitive path, a parent of one, a
// runtime-state tree outside the writable paths, or, for a read-write
// mount, a write-protected directory outside them; "" for none.
//
// It is for the node, which sees where a link leads where admission sees
// only the name: whatever a name admission judged, a mount that the node
// resolves through a link into these classes is one the policy would have
// denied by that name, or admitted only under conditions (read-only, not
// root) that a link planted by another pod was never judged by. So unlike
// sensitive-hostpath, a parent is named whatever the container.
func (e *Engine) ResolvedHostPathReach(p string, readOnly bool) string {
	p = cleanAbsolute(p)
	if procHostLink.MatchString(p) {
		return "a per-process link of /proc"
	}
	if s, below := e.sensitiveRelation(p); s != "" {
		if below {
			return "the sensitive path " + s
		}
		return "a parent of the sensitive path " + s
	}
	if e.isWritable(p) {
		return ""
	}
	if r := firstRelated(e.runtimeState, p); r != "" {
		return "the runtime-state tree " + r
	}
	if readOnly {
		return ""
	}
	if w := firstRelated(e.writeProtected, p); w != "" {
		return "the system directory " + w + ", mounted read-write"
	}
	return ""
}

// PodMayPlantLinkIn reports whether a pod may have planted a link in host
// directory dir: one in a writable data directory, in a runtime-state tree
// (pods' emptyDirs lie in the kubelet's), or in no directory the policy
// names (/data, /tmp, /mnt: any pod may mount them read-write). Sensitive
// paths and system directories (writeProtectedHostPaths) no pod may write
// through a host path volume, so a link there is the host's own: /var/run,
// /etc/resolv.conf, /etc/localtime, merged-/usr's /bin.
func (e *Engine) PodMayPlantLinkIn(dir string) bool {
	dir = cleanAbsolute(dir)
	if e.isWritable(dir) {
		return true
	}
	if _, below := e.sensitiveRelation(dir); below {
		return false
	}
	for _, aliases := range e.runtimeState {
		for _, r := range aliases {
			if dir == r || strings.HasPrefix(dir, r+"/") {
				return true
			}
		}
	}
	return firstRelated(e.writeProtected, dir) == ""
}
