package policy

import (
	"path"
	"strings"
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
func checkDeviceListMounts(ev *evaluation, c *containerRef) {
	for i, m := range c.c.VolumeMounts {
		mp := cleanAbsolute(m.MountPath)
		for _, root := range ev.e.policy.Spec.DeviceListMountRoots {
			if strings.HasPrefix(mp, root) {
				ev.report(RuleDeviceListMount, effectDeny, c, c.path().Child("volumeMounts").Index(i).Child("mountPath").String(),
					"container %q mounts %q, which requests GPUs from the NVIDIA runtime; mount it elsewhere", c.c.Name, mp)
				break
			}
		}
	}
}

// cleanAbsolute cleans a path the way the runtime sees it: rooted, without dot
// segments or doubled slashes.
func cleanAbsolute(p string) string {
	return path.Clean("/" + p)
}
