package policy

import (
	"fmt"
	"github.com/gpuguard/gpuguard/policy/celexpr"
	"maps"
	"slices"
	"strings"
)

// checkDeviceAnnotations is the rule device-annotation: device requests through pod
// annotations.
//
// Fields read:
//   - metadata.annotations of the pod, of a controller's pod template, or of a
//     Binding (pods/binding), whose annotations the API server copies onto the pod.
//
// Allowed values: any key that neither starts with one of the policy's
// annotations.deniedPrefixes nor equals one of annotations.deniedKeys. The defaults
// name every annotation that node software turns into devices, mounts or device
// cgroup access: CDI requests (cdi.k8s.io/, read by containerd, CRI-O and the NVIDIA
// runtime where pod annotations reach the OCI spec), the NVIDIA NRI plugin
// (nvidia.cdi.k8s.io), containerd's NRI device-injector under its current
// noderesource.dev and older nri.io domains (devices, CDI devices, mounts, network
// devices, writable cgroups), GKE's injector (devices.gke.io), the CDI NRI injector
// (cdi.nri.io) and CRI-O's device and cgroup annotations. docs/threat-model.md lists
// the source of each. On an UPDATE of a pod or of its status only keys it adds or
// changes count: the NRI plugins and the kubelet read them again when a sandbox is
// recreated. Default action: deny, whatever the action.
func checkDeviceAnnotations(in *Input) []Finding {
	var out []Finding
	for _, key := range in.judgedAnnotations() {
		if !in.e.deniedAnnotation(key) {
			continue
		}
		out = append(out, podFinding(RuleDeviceAnnotation, effectDeny, in.t.metaPath.Child("annotations").Key(key).String(),
			"requests devices outside GPU accounting; remove it"))
	}
	return out
}

// judgedAnnotations lists, sorted, the annotation keys a request puts up for
// judgement: all of them, or on an update those it adds or changes.
func (in *Input) judgedAnnotations() []string {
	a := in.t.meta.Annotations
	keys := make([]string, 0, len(a))
	for _, key := range slices.Sorted(maps.Keys(a)) {
		if old, ok := in.oldAnnotations[key]; ok && old == a[key] && in.scope == scopeAddedAnnotations {
			continue
		}
		keys = append(keys, key)
	}
	return keys
}

func (e *Engine) deniedAnnotation(key string) bool {
	a := &e.policy.Spec.Annotations
	if slices.Contains(a.DeniedKeys, key) {
		return true
	}
	return slices.ContainsFunc(a.DeniedPrefixes, func(p string) bool { return strings.HasPrefix(key, p) })
}

// RuleDeviceAnnotation is the rule of checkDeviceAnnotations.
const RuleDeviceAnnotation RuleID = "device-annotation"

func init() {
	register(&Rule{
		ID:      RuleDeviceAnnotation,
		Summary: "denied annotations; on an UPDATE of a pod or of `pods/status`, only those added or changed; a `Binding`'s annotations, which the API server copies onto the pod",
		Order:   10, PodCheck: checkDeviceAnnotations, PodScopes: []scope{scopePod, scopeTemplate, scopeAddedAnnotations},
		// Any denied key, changed or not.
		Trigger: func(in *CELInput) *CELTrigger {
			return &CELTrigger{Pod: fmt.Sprintf(`has(object.metadata.annotations) && object.metadata.annotations.exists(k, %s)`, deniedAnnotationCEL(in))}
		},
		CEL: func(in *CELInput) *CELCheck {
			denied := deniedAnnotationCEL(in)
			return &CELCheck{Message: "annotation requests devices outside GPU accounting; remove it",
				Pod: fmt.Sprintf(celexpr.SubResource+` in ["", "status"] && has(object.metadata.annotations) && object.metadata.annotations.exists(k, (%s) && `+
					`(request.operation == "CREATE" || !has(oldObject.metadata.annotations) || !(k in oldObject.metadata.annotations) || `+
					`oldObject.metadata.annotations[k] != object.metadata.annotations[k]))`, denied)}
		},
	})
}

// deniedAnnotationCEL is a predicate over an annotation key k: the policy
// denies it.
func deniedAnnotationCEL(in *CELInput) string {
	a := in.Policy.Spec.Annotations
	var tests []string
	// An empty list is left out: the pre-filter would test every key against it.
	if len(a.DeniedKeys) > 0 {
		tests = append(tests, fmt.Sprintf("k in %s", celexpr.List(a.DeniedKeys)))
	}
	if len(a.DeniedPrefixes) > 0 {
		tests = append(tests, fmt.Sprintf("%s.exists(p, k.startsWith(p))", celexpr.List(a.DeniedPrefixes)))
	}
	if len(tests) == 0 {
		return "false"
	}
	return celexpr.Or(tests...)
}
