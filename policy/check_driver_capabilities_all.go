package policy

import "strings"

// checkDriverCapabilitiesAll is the advisory rule driver-capabilities-all: a
// GPU container asking the NVIDIA runtime for every driver capability.
//
// Fields read, in every container kind with GPU resources:
//   - env[*].name and env[*].value, for NVIDIA_DRIVER_CAPABILITIES (literal
//     values; a ConfigMap's are read by envfrom-unprefixed).
//
// Allowed values: any list without "all". "all" has the runtime mount every
// driver library and binary it knows into the container (graphics, display,
// video, ngx and compat32 besides compute and utility): more of the driver's
// surface than a compute workload needs. Containers without GPUs may not set
// the variable at all (protected-env). Effect: warn.
func checkDriverCapabilitiesAll(in *Input, c *containerRef) []Finding {
	if !in.gpuFeatures(c) {
		return nil
	}
	var out []Finding
	for i, v := range c.c.Env {
		if v.Name != "NVIDIA_DRIVER_CAPABILITIES" || v.ValueFrom != nil {
			continue
		}
		for capability := range strings.SplitSeq(v.Value, ",") {
			if strings.TrimSpace(capability) == "all" {
				out = append(out, containerFinding(RuleDriverCapabilitiesAll, effectWarn, c, c.path().Child("env").Index(i).String(),
					"asks for all driver capabilities; list only those it needs"))
				break
			}
		}
	}
	return out
}

// RuleDriverCapabilitiesAll is the rule of checkDriverCapabilitiesAll.
const RuleDriverCapabilitiesAll RuleID = "driver-capabilities-all"

func init() {
	register(&Rule{
		ID:      RuleDriverCapabilitiesAll,
		Summary: "advisory (warn): a GPU container setting `NVIDIA_DRIVER_CAPABILITIES` to `all`, which mounts graphics, display and video libraries besides compute's",
		Order:   125, ContainerCheck: checkDriverCapabilitiesAll,
		Trigger: func(in *CELInput) *CELTrigger {
			return &CELTrigger{Env: `e.name == "NVIDIA_DRIVER_CAPABILITIES" && !has(e.valueFrom) && has(e.value) && e.value.contains("all")`,
				EnvNames: []string{"NVIDIA_DRIVER_CAPABILITIES"}}
		},
		Gap: "a warning only: the backstop renders what denies",
	})
}
