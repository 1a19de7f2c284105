package policy

import (
	"regexp"
)

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

// procLinkHostPath is the class of sensitive-hostpath for host paths
// through a per-process link of /proc: denied whatever the container, since
// no list of sensitive paths can judge where they lead.
func procLinkHostPath(in *Input, hp hostPathVolume) []Finding {
	return in.denyHostPath(hp, "%s is a link of /proc that the runtime follows on the host, to the host's root or wherever a process's directory or file is; "+
		"name the host path itself", quote(hp.volume.HostPath.Path))
}
