package policy

import (
	"testing"

	"github.com/gpuguard/gpuguard/config"
)

func TestWriteProtectedHostPath(t *testing.T) {
	msg := func(path, w string) string {
		return sprintf("mounts %q read-write, which is, holds or lies in the system directory %s, whose files the node runs, loads or trusts as root; "+
			"mount it readOnly, or use a data directory (writableHostPaths)", path, w)
	}
	owned := func(path, w string) string {
		return sprintf("mounts %q read-write, which lies in the data directory %s, whose writableHostPaths entry lets only its owners' service accounts write it "+
			"(node software consumes what is there as root); mount it readOnly", path, w)
	}
	scoped := func(s *config.PolicySpec) {
		s.WritableHostPaths = append(s.WritableHostPaths, config.WritableHostPath{Path: "/var/log", ServiceAccounts: []config.ServiceAccountRef{{Namespace: "ns", Name: "default"}}})
	}
	scopedElsewhere := func(s *config.PolicySpec) {
		s.WritableHostPaths = append(s.WritableHostPaths, config.WritableHostPath{Path: "/var/log", Namespaces: []string{"logging"}})
	}
	runRuleTable(t, []ruleCase{
		{name: "read-only", req: Request{Object: hostPathPod("/etc/ssl", true, ctr("a"))}},
		{name: "a writable data directory", req: Request{Object: hostPathPod("/var/tmp", false, ctr("a"))}},
		{name: "a scoped data directory, its owner", policy: scoped, req: Request{Object: hostPathPod("/var/log", false, ctr("a"))}},
		{name: "a scoped data directory, read-only", policy: scopedElsewhere, req: Request{Object: hostPathPod("/var/log", true, ctr("a"))}},
		{name: "a scoped data directory, another pod", policy: scopedElsewhere, req: Request{Object: hostPathPod("/var/log/pods/x", false, ctr("a"))},
			want: []found{{RuleSensitiveHostPath, effectDeny, "a", "spec.volumes[1].hostPath.path", owned("/var/log/pods/x", "/var/log"), editNone}}},
		{name: "a scoped data directory outside the system trees", policy: func(s *config.PolicySpec) {
			s.WritableHostPaths = []config.WritableHostPath{{Path: "/mnt/longhorn", Namespaces: []string{"longhorn-system"}}}
		}, req: Request{Object: hostPathPod("/mnt/longhorn", false, ctr("a"))},
			want: []found{{RuleSensitiveHostPath, effectDeny, "a", "spec.volumes[1].hostPath.path", owned("/mnt/longhorn", "/mnt/longhorn"), editNone}}},
		{name: "unrelated", req: Request{Object: hostPathPod("/data", false, ctr("a"))}},
		{name: "read-write, each container", req: Request{Object: hostPathPod("/etc/ssl", false, ctr("a"), ctr("b"))},
			want: []found{
				{RuleSensitiveHostPath, effectDeny, "a", "spec.volumes[1].hostPath.path", msg("/etc/ssl", "/etc"), editNone},
				{RuleSensitiveHostPath, effectDeny, "b", "spec.volumes[1].hostPath.path", msg("/etc/ssl", "/etc"), editNone},
			}},
	}, hostPathClass(writeProtectedHostPath), nil)
}
