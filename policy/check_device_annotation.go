package policy

import (
	"maps"
	"slices"
	"strings"
)

// checkDeviceAnnotations is the rule device-annotation: device requests through pod
// annotations.
//
// Fields read:
//   - metadata.annotations of the pod, or of a controller's pod template.
//
// Allowed values: any key that neither starts with one of the policy's
// annotations.deniedPrefixes (default cdi.k8s.io/, nvidia.cdi.k8s.io,
// devices.nri.io) nor equals one of annotations.deniedKeys (default
// io.kubernetes.cri-o.Devices). Such annotations request CDI devices where containerd
// passes pod annotations through, or where the NVIDIA NRI plugin runs. On an UPDATE of
// a pod only keys it adds or changes count: the NRI plugin and the kubelet read them
// again when a sandbox is recreated. Default action: deny, whatever the action.
func checkDeviceAnnotations(ev *evaluation) {
	a := ev.t.meta.Annotations
	if len(a) == 0 {
		return
	}
	for _, key := range slices.Sorted(maps.Keys(a)) {
		if !ev.e.deniedAnnotation(key) {
			continue
		}
		if old, ok := ev.oldAnnotations[key]; ok && old == a[key] && ev.scope == scopeAddedAnnotations {
			continue
		}
		ev.report(RuleDeviceAnnotation, effectDeny, nil, ev.t.metaPath.Child("annotations").Key(key).String(),
			"annotation %q requests devices outside GPU accounting; remove it", key)
	}
}

func (e *Engine) deniedAnnotation(key string) bool {
	a := &e.policy.Spec.Annotations
	if slices.Contains(a.DeniedKeys, key) {
		return true
	}
	return slices.ContainsFunc(a.DeniedPrefixes, func(p string) bool { return strings.HasPrefix(key, p) })
}
