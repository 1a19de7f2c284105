package policy

import (
	"fmt"
	"github.com/gpuguard/gpuguard/policy/celexpr"
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
					"%s exposes %s; use a GPU resource instead", quote(v.HostPath.Path),
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

// RuleSensitiveHostPath is the rule of checkSensitiveHostPaths.
const RuleSensitiveHostPath RuleID = "sensitive-hostpath"

func init() {
	register(&Rule{
		ID:      RuleSensitiveHostPath,
		Summary: "hostPath volumes related to sensitive paths",
		Order:   30, PodCheck: checkSensitiveHostPaths, PodScopes: []scope{scopePod, scopeTemplate},
		// Any host path: a parent of a sensitive path is one too, and paths
		// CEL cannot clean are left to the webhook.
		Trigger: func(in *CELInput) *CELTrigger {
			return &CELTrigger{Pod: `has(object.spec.volumes) && object.spec.volumes.exists(v, has(v.hostPath))`}
		},
		Gap: "host paths that need cleaning (`..`, `//`, `./`): CEL has no `path.Clean`, so they are left to the webhook rather than judged wrongly",
		CEL: sensitiveHostPathCEL,
	})
}

// sensitiveHostPathCEL: a hostPath equal to, below or above a sensitive path,
// with /run and /var/run alike, for paths CEL can judge.
func sensitiveHostPathCEL(in *CELInput) *CELCheck {
	var paths []string
	for _, s := range in.Policy.Spec.SensitiveHostPaths {
		paths = append(paths, RunAliases(s)...)
	}
	slices.Sort(paths)
	p := celexpr.CleanPath("v.hostPath.path")
	return &CELCheck{Message: "mounts a host path that exposes devices or the NVIDIA runtime's configuration",
		Pod: fmt.Sprintf(`request.operation == "CREATE" && has(object.spec.volumes) && object.spec.volumes.exists(v, has(v.hostPath) && %s && `+
			`%s.exists(s, %[3]s == s || %[3]s == "/" || %[3]s.startsWith(s + "/") || s.startsWith(%[3]s + "/")))`,
			celexpr.Judgeable("v.hostPath.path"), celexpr.List(slices.Compact(paths)), p)}
}
