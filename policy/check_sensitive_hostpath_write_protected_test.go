package policy

import (
	"testing"
)

func TestWriteProtectedHostPath(t *testing.T) {
	msg := func(path, w string) string {
		return sprintf("mounts %q read-write, which is, holds or lies in the system directory %s, whose files the node runs, loads or trusts as root; "+
			"mount it readOnly, or use a data directory (writableHostPaths)", path, w)
	}
	runRuleTable(t, []ruleCase{
		{name: "read-only", req: Request{Object: hostPathPod("/etc/ssl", true, ctr("a"))}},
		{name: "a writable data directory", req: Request{Object: hostPathPod("/var/log/pods", false, ctr("a"))}},
		{name: "unrelated", req: Request{Object: hostPathPod("/data", false, ctr("a"))}},
		{name: "read-write, each container", req: Request{Object: hostPathPod("/etc/ssl", false, ctr("a"), ctr("b"))},
			want: []found{
				{RuleSensitiveHostPath, effectDeny, "a", "spec.volumes[1].hostPath.path", msg("/etc/ssl", "/etc"), editNone},
				{RuleSensitiveHostPath, effectDeny, "b", "spec.volumes[1].hostPath.path", msg("/etc/ssl", "/etc"), editNone},
			}},
	}, hostPathClass(writeProtectedHostPath), nil)
}
