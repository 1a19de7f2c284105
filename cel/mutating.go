package cel

import (
	"fmt"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuguard/gpuguard/internal/wellknown"
	"github.com/gpuguard/gpuguard/policy"
	"github.com/gpuguard/gpuguard/policy/celexpr"
)

// mutatingPolicy injects NVIDIA_VISIBLE_DEVICES=void (and each extra device
// variable) into every container without GPU resources whose effective value is
// not void or "", as the webhook's mutating phase does: appended as new env
// entries, since pod env outranks image ENV and envFrom. GPU containers and mirror
// pods are never touched. It also pins the groups of a new pod that mounts a
// parent of a sensitive path read-only (pin-parent-groups). Reapplying changes
// nothing, so it may be reinvoked.
func (r *rules) mutatingPolicy(name string) *admissionregistrationv1.MutatingAdmissionPolicy {
	var patches []string
	for _, l := range containerLists {
		patches = append(patches, r.voidPatches(l))
	}
	patches = append(patches, r.voidAnnotation())
	if pins := policy.ParentGroupPinsCEL(r.input()); pins != "" {
		if w := r.waives(policy.RulePinParentGroups); w != "" {
			pins = fmt.Sprintf("(%s ? [] : %s)", w, pins)
		}
		patches = append(patches, pins)
	}
	conds := append(r.exemptions(), admissionregistrationv1.MatchCondition{Name: "not-a-mirror-pod", Expression: "!" + celexpr.MirrorPod},
		admissionregistrationv1.MatchCondition{Name: InjectionPrefilterName, Expression: r.hasInjectionWork})
	return &admissionregistrationv1.MutatingAdmissionPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "MutatingAdmissionPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: admissionregistrationv1.MutatingAdmissionPolicySpec{
			FailurePolicy:      &failClosed,
			MatchConstraints:   podRules([2]string{"CREATE", "pods"}, [2]string{"UPDATE", "pods/ephemeralcontainers"}),
			MatchConditions:    conds,
			ReinvocationPolicy: admissionregistrationv1.IfNeededReinvocationPolicy,
			Mutations: []admissionregistrationv1.Mutation{{
				PatchType: admissionregistrationv1.PatchTypeJSONPatch,
				JSONPatch: &admissionregistrationv1.JSONPatch{Expression: strings.Join(patches, " + ")},
			}},
		},
	}
}

// needsVoid is the CEL condition that container c of list l gets void.
func (r *rules) needsVoid(l containerList) string {
	judged := `request.operation == "CREATE"`
	if l.field == "ephemeralContainers" {
		judged = `(request.operation == "CREATE" || !(has(oldObject.spec.ephemeralContainers) && oldObject.spec.ephemeralContainers.exists(o, o.name == c.name)))`
	}
	var allVoid []string
	for _, n := range r.deviceVars {
		allVoid = append(allVoid, policy.EffectivelyVoidCEL(r.p, n))
	}
	needs := fmt.Sprintf("%s && !(%s) && !(%s)", judged, r.gpu, strings.Join(allVoid, " && "))
	if w := r.waives(policy.RuleInjectVoid); w != "" {
		needs = "!" + w + " && " + needs
	}
	if !r.p.Spec.InjectVoid {
		// The toolkit's privileged containers get void whatever the policy
		// says (inject-void).
		needs = policy.ToolkitPrivilegedCEL + " && " + needs
	}
	return needs
}

// voidAnnotation is a CEL list of the JSON Patch operation that names, in
// wellknown.VoidAnnotation, the containers of a new pod that get void, as
// the webhook does; empty when none does. Updates (of ephemeral containers)
// take no annotation: that subresource takes only the containers.
func (r *rules) voidAnnotation() string {
	var names []string
	for _, l := range containerLists {
		names = append(names, fmt.Sprintf(`(has(object.spec.%[1]s) ? object.spec.%[1]s.filter(c, %[2]s).map(c, c.name) : [])`, l.field, r.needsVoid(l)))
	}
	key := celexpr.Str(wellknown.VoidAnnotation)
	pointer := celexpr.Str(policy.AnnotationPointer(wellknown.VoidAnnotation))
	return fmt.Sprintf(`(request.operation != "CREATE" ? [] : [%[1]s].map(names, names.join(",")).filter(v, v != "").map(v, has(object.metadata.annotations) ? `+
		`JSONPatch{op: "add", path: %[2]s, value: v} : JSONPatch{op: "add", path: "/metadata/annotations", value: {%[3]s: v}}))`,
		strings.Join(names, " + "), pointer, key)
}

// voidPatches is a CEL list of JSON Patch operations for one container list.
func (r *rules) voidPatches(l containerList) string {
	needs := r.needsVoid(l)
	path := fmt.Sprintf(`"/spec/%s/" + string(i) + "/env"`, l.field)
	entry := func(n string) string {
		return fmt.Sprintf(`Object.spec.%s.env{name: %s, value: "void"}`, l.field, celexpr.Str(n))
	}
	var entries, appends []string
	for _, n := range r.deviceVars {
		entries = append(entries, entry(n))
		appends = append(appends, fmt.Sprintf(`(%s ? [] : [JSONPatch{op: "add", path: %s + "/-", value: %s}])`, policy.EffectivelyVoidCEL(r.p, n), path, entry(n)))
	}
	perContainer := fmt.Sprintf(`has(c.env) ? %s : [JSONPatch{op: "add", path: %s, value: [%s]}]`,
		strings.Join(appends, " + "), path, strings.Join(entries, ", "))
	return fmt.Sprintf(`(has(object.spec.%[1]s) ? object.spec.%[1]s.transformList(i, c, %[2]s, %[3]s).flatten() : [])`, l.field, needs, perContainer)
}

func mutatingBinding(name string, match *admissionregistrationv1.MatchResources) *admissionregistrationv1.MutatingAdmissionPolicyBinding {
	return &admissionregistrationv1.MutatingAdmissionPolicyBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "MutatingAdmissionPolicyBinding"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec:       admissionregistrationv1.MutatingAdmissionPolicyBindingSpec{PolicyName: name, MatchResources: match},
	}
}
