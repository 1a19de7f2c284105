package policy

import (
	"testing"

	"github.com/gpuguard/gpuguard/config"
)

func TestExposedHostPath(t *testing.T) {
	at := "spec.volumes[1].hostPath.path"
	runRuleTable(t, []ruleCase{
		{name: "below a sensitive path", req: Request{Object: hostPathPod("/dev/nvidia0", true, ctr("a"))},
			want: []found{{RuleSensitiveHostPath, effectDeny, "", at, `"/dev/nvidia0" exposes /dev; use a GPU resource instead`, editNone}}},
		{name: "under its other name", req: Request{Object: hostPathPod("/run/cdi", true, withSC(ctr("a"), unprivileged()))},
			want: []found{{RuleSensitiveHostPath, effectDeny, "", at, `"/run/cdi" exposes /var/run/cdi; use a GPU resource instead`, editNone}}},
		{name: "a parent, where parents are denied", policy: func(s *config.PolicySpec) { s.SensitiveHostPathParents = config.ParentsDeny },
			req:  Request{Object: hostPathPod("/var/lib", true, withSC(ctr("a"), unprivileged()))},
			want: []found{{RuleSensitiveHostPath, effectDeny, "", at, `"/var/lib" exposes /var/lib/kubelet/device-plugins; use a GPU resource instead`, editNone}}},
	}, hostPathClass(func(in *Input, hp hostPathVolume) []Finding {
		reach, _ := in.e.guardedRelation(hp.path)
		return exposedHostPath(in, hp, reach)
	}), nil)
}
