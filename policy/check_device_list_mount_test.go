package policy

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestCheckDeviceListMounts(t *testing.T) {
	mounting := func(paths ...string) corev1.Container {
		c := ctr("a")
		for _, p := range paths {
			c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "v", MountPath: p})
		}
		return c
	}
	msg := "is where the NVIDIA runtime reads device requests; mount elsewhere"
	runRuleTable(t, []ruleCase{
		{name: "elsewhere", req: Request{Object: podOf(mounting("/data", "/var/run/nvidia"))}},
		{name: "under a root, cleaned, as a string prefix", req: Request{Object: podOf(mounting("/data", "/var/run/nvidia-container-devicesall", "/x/../run//nvidia-container-devices/0"))},
			want: []found{
				{RuleDeviceListMount, effectDeny, "a", "spec.containers[0].volumeMounts[1].mountPath", msg, editNone},
				{RuleDeviceListMount, effectDeny, "a", "spec.containers[0].volumeMounts[2].mountPath", msg, editNone},
			}},
	}, nil, checkDeviceListMounts)
}
