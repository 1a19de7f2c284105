package policy

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuguard/gpuguard/policy/celexpr"
)

// writeProtectedHostPath is the class of sensitive-hostpath for host paths
// at, below or above one of the policy's writeProtectedHostPaths, outside
// its writableHostPaths: each container that mounts one other than readOnly
// is denied.
func writeProtectedHostPath(in *Input, hp hostPathVolume) []Finding {
	w := in.e.writeProtectedRelation(hp.path)
	if w == "" {
		return nil
	}
	var out []Finding
	for k := range in.containers {
		c := &in.containers[k]
		if mountsWritable(c.c, hp.volume.Name) {
			out = append(out, containerFinding(RuleSensitiveHostPath, effectDeny, c, hp.at,
				"mounts %s read-write, which is, holds or lies in the system directory %s, whose files the node runs, loads or trusts as root; "+
					"mount it readOnly, or use a data directory (writableHostPaths)", quote(hp.volume.HostPath.Path), w))
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

// mountsWritable reports whether container c mounts the named volume other
// than readOnly.
func mountsWritable(c *corev1.Container, volume string) bool {
	return slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == volume && !m.ReadOnly })
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
