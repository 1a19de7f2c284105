package cel

import (
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/policy"
	"github.com/gpuguard/gpuguard/policy/celexpr"
)

// KAIGuardName names the ConfigMap guard of the backstop named name.
func KAIGuardName(name string) string { return name + "-kai-configmaps" }

// kaiGuard is the ConfigMap guard of the KAI fraction integration, nil with it
// off. With it on, gpuguard accepts NVIDIA_VISIBLE_DEVICES from the ConfigMap
// KAI's binder writes for a fraction container; tenants can usually write
// ConfigMaps in their namespace, so the guard lets only the binder's accounts
// create or update ConfigMaps with the names the binder uses. Deleting one
// only keeps the pod from starting.
func kaiGuard(p *config.Policy, name string, match *admissionregistrationv1.MatchResources) (*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding) {
	k := &p.Spec.Integrations.KAIScheduler
	if !k.Fractions {
		return nil, nil
	}
	name = KAIGuardName(name)
	match = match.DeepCopy()
	match.ResourceRules = []admissionregistrationv1.NamedRuleWithOperations{{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
		Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
	}}}
	vap := &admissionregistrationv1.ValidatingAdmissionPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingAdmissionPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy:    &failClosed,
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: match.ResourceRules},
			MatchConditions: []admissionregistrationv1.MatchCondition{{Name: "kai-fraction-configmap",
				Expression: fmt.Sprintf("object.metadata.name.matches(%s)", celexpr.Str(policy.KAIConfigMapNamePattern))}},
			Validations: []admissionregistrationv1.Validation{{
				Expression: fmt.Sprintf("request.userInfo.username in %s", celexpr.List(k.BinderServiceAccounts)),
				Message: "gpuguard: only KAI Scheduler's binder may write a ConfigMap named like a GPU fraction's " +
					"(PREFIX-shared-gpu-INDEX): gpuguard trusts the NVIDIA_VISIBLE_DEVICES in it; choose another name",
				Reason: ptr(metav1.StatusReasonForbidden),
			}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingAdmissionPolicyBinding"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			MatchResources:    &admissionregistrationv1.MatchResources{NamespaceSelector: match.NamespaceSelector}},
	}
	return vap, binding
}
