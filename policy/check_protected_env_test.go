package policy

import (
	"testing"
)

func TestCheckProtectedEnv(t *testing.T) {
	runRuleTable(t, []ruleCase{
		{name: "unprotected", req: Request{Object: podOf(ctr("a", envVar("LOG", "1")))}},
		{name: "allowed value on a GPU container", req: Request{Object: podOf(gpuCtr("g", envVar("NVIDIA_DRIVER_CAPABILITIES", "compute,utility")))}},
		{name: "without a GPU", req: Request{Object: podOf(ctr("a", envVar("LOG", "1"), envVar("NVIDIA_DRIVER_CAPABILITIES", "compute")))},
			want: []found{{RuleProtectedEnv, effectDeny, "a", "spec.containers[0].env[1]", "sets NVIDIA_DRIVER_CAPABILITIES without a GPU limit; remove it", editNone}}},
		{name: "value not allowed", req: Request{Object: podOf(gpuCtr("g", envVar("NVIDIA_DRIVER_CAPABILITIES", "compute,bogus")))},
			want: []found{{RuleProtectedEnv, effectDeny, "g", "spec.containers[0].env[0]",
				`sets NVIDIA_DRIVER_CAPABILITIES with "bogus"; allowed: compute,compat32,graphics,utility,video,display,ngx,all`, editNone}}},
		{name: "allowed on no workload", req: Request{Object: podOf(gpuCtr("g", envVar("NVIDIA_MIG_CONFIG_DEVICES", "all")))},
			want: []found{{RuleProtectedEnv, effectDeny, "g", "spec.containers[0].env[0]", "sets NVIDIA_MIG_CONFIG_DEVICES, which the policy allows no workload; remove it", editNone}}},
	}, nil, checkProtectedEnv)
}
