package policy

import (
	"testing"
)

func TestCheckDriverCapabilitiesAll(t *testing.T) {
	runRuleTable(t, []ruleCase{
		{name: "listed capabilities", req: Request{Object: podOf(gpuCtr("g", envVar("NVIDIA_DRIVER_CAPABILITIES", "compute,utility")))}},
		{name: "container without GPUs left to protected-env", req: Request{Object: podOf(ctr("a", envVar("NVIDIA_DRIVER_CAPABILITIES", "all")))}},
		{name: "all among others", req: Request{Object: podOf(gpuCtr("g", envVar("NVIDIA_DRIVER_CAPABILITIES", "compute, all")))},
			want: []found{{RuleDriverCapabilitiesAll, effectWarn, "g", "spec.containers[0].env[0]", "asks for all driver capabilities; list only those it needs", editNone}}},
	}, nil, checkDriverCapabilitiesAll)
}
