package policy

import (
	"slices"
	"strings"
)

// checkSensitiveHostPaths is the rule sensitive-hostpath: host directories that
// hold device nodes, device plugin sockets, CDI specs or the runtime's configuration.
//
// Fields read:
//   - spec.volumes[*].hostPath.path.
//
// Allowed values: a path that is neither equal to, below, nor above one of the
// policy's sensitiveHostPaths (default /dev, /var/lib/kubelet/device-plugins,
// /etc/cdi, /var/run/cdi, /etc/nvidia-container-runtime). /run and /var/run are
// treated alike, so / and /var are caught too. Default action: deny, whatever the
// action. Pod Security Admission "baseline" forbids every hostPath.
func checkSensitiveHostPaths(ev *evaluation) {
	for i, v := range ev.t.spec.Volumes {
		if v.HostPath == nil {
			continue
		}
		p := cleanAbsolute(v.HostPath.Path)
		for k, aliases := range ev.e.sensitiveHostPaths {
			if slices.ContainsFunc(aliases, func(s string) bool { return related(p, s) }) {
				ev.report(RuleSensitiveHostPath, effectDeny, nil,
					ev.t.specPath.Child("volumes").Index(i).Child("hostPath", "path").String(),
					"volume %q mounts host path %q, which exposes %s; use a GPU resource instead", v.Name, v.HostPath.Path,
					ev.e.policy.Spec.SensitiveHostPaths[k])
				break
			}
		}
	}
}

// RunAliases cleans a path and lists it under both /run and /var/run, its usual
// symlink, so that a host path is compared with each spelling.
func RunAliases(p string) []string {
	p = cleanAbsolute(p)
	switch {
	case p == "/run" || strings.HasPrefix(p, "/run/"):
		return []string{p, "/var" + p}
	case p == "/var/run" || strings.HasPrefix(p, "/var/run/"):
		return []string{p, strings.TrimPrefix(p, "/var")}
	}
	return []string{p}
}

// related reports whether two clean absolute paths are equal or one lies below the other.
func related(a, b string) bool {
	return a == b || a == "/" || b == "/" || strings.HasPrefix(a, b+"/") || strings.HasPrefix(b, a+"/")
}
