package policy

import (
	"fmt"
	"path"
	"strings"

	"github.com/gpuguard/gpuguard/policy/celexpr"
)

// checkDeviceListMounts is the rule device-list-mount: forged volume-mount device
// requests.
//
// Fields read, in every container kind:
//   - volumeMounts[*].mountPath.
//
// Allowed values: any path that, cleaned, does not start with one of the policy's
// deviceListMountRoots (default /var/run/nvidia-container-devices and
// /run/nvidia-container-devices). The toolkit matches these as plain string
// prefixes, so /var/run/nvidia-container-devicesall asks for "all". Only the device
// plugin may put mounts there. Default action: deny, in every mode of action.
func checkDeviceListMounts(in *Input, c *containerRef) []Finding {
	var out []Finding
	for i, m := range c.c.VolumeMounts {
		mp := cleanAbsolute(m.MountPath)
		for _, root := range in.e.policy.Spec.DeviceListMountRoots {
			if strings.HasPrefix(mp, root) {
				out = append(out, containerFinding(RuleDeviceListMount, effectDeny, c, c.path().Child("volumeMounts").Index(i).Child("mountPath").String(),
					"is where the NVIDIA runtime reads device requests; mount elsewhere"))
				break
			}
		}
	}
	return out
}

// cleanAbsolute cleans a path the way the runtime sees it: rooted, without dot
// segments or doubled slashes.
func cleanAbsolute(p string) string {
	return path.Clean("/" + p)
}

// RuleDeviceListMount is the rule of checkDeviceListMounts.
const RuleDeviceListMount RuleID = "device-list-mount"

func init() {
	register(&Rule{
		ID:      RuleDeviceListMount,
		Summary: "a volume mount under the device-list roots",
		Order:   160, ContainerCheck: checkDeviceListMounts,
		// Paths CEL cannot clean, as well as any that contains a root
		// without its leading "/": a superset of the paths under a root
		// (rooted or not, with a trailing "/" or not), tested without
		// building the rooted path, which every pod's service account
		// token mount would otherwise pay for.
		Trigger: func(in *CELInput) *CELTrigger {
			var unrooted []string
			for _, root := range in.Policy.Spec.DeviceListMountRoots {
				unrooted = append(unrooted, strings.TrimPrefix(root, "/"))
			}
			return &CELTrigger{Container: fmt.Sprintf(`has(c.volumeMounts) && c.volumeMounts.exists(m, !(%s) || %s.exists(root, m.mountPath.contains(root)))`,
				celexpr.Judgeable("m.mountPath"), celexpr.List(unrooted))}
		},
		Gap: "mount paths that need cleaning (`..`, `//`, `./`): CEL has no `path.Clean`, so they are left to the webhook rather than judged wrongly",
		CEL: func(in *CELInput) *CELCheck {
			pred := fmt.Sprintf(`has(c.volumeMounts) && c.volumeMounts.exists(m, %s && %s.exists(root, %s.startsWith(root)))`,
				celexpr.Judgeable("m.mountPath"), celexpr.List(in.Policy.Spec.DeviceListMountRoots), celexpr.CleanPath("m.mountPath"))
			return &CELCheck{Plain: pred, GPU: pred, Message: "mounts a volume under the NVIDIA device-list directory; mount it elsewhere"}
		},
	})
}
