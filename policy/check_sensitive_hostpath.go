package policy

import "strings"

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
		p := normaliseHostPath(v.HostPath.Path)
		for k, s := range ev.e.sensitiveHostPaths {
			if related(p, s) {
				s = ev.e.policy.Spec.SensitiveHostPaths[k]
				ev.report(RuleSensitiveHostPath, effectDeny, nil,
					ev.t.specPath.Child("volumes").Index(i).Child("hostPath", "path").String(),
					"volume %q mounts host path %q, which exposes %s; use a GPU resource instead", v.Name, v.HostPath.Path, s)
				break
			}
		}
	}
}

// normaliseHostPath cleans a host path and writes /var/run as /run, its usual symlink.
func normaliseHostPath(p string) string {
	p = cleanAbsolute(p)
	if p == "/var/run" || strings.HasPrefix(p, "/var/run/") {
		p = "/run" + strings.TrimPrefix(p, "/var/run")
	}
	return p
}

// related reports whether two clean absolute paths are equal or one lies below the other.
func related(a, b string) bool {
	return a == b || a == "/" || b == "/" || strings.HasPrefix(a, b+"/") || strings.HasPrefix(b, a+"/")
}
