package framework

import (
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// GPUGuardWebhooks are gpuguard's webhook configurations for a release in
// releaseNS: the release namespace, kube-system, kube-node-lease and the excluded
// namespaces are outside their namespaceSelector.
func GPUGuardWebhooks(releaseNS string, excluded ...string) (*WebhookConfigurations, error) {
	path := func(p string) *admissionregistrationv1.ServiceReference {
		return &admissionregistrationv1.ServiceReference{Namespace: releaseNS, Name: "gpuguard-webhook", Path: &p}
	}
	none := admissionregistrationv1.SideEffectClassNone
	ignore, fail := admissionregistrationv1.Ignore, admissionregistrationv1.Fail
	ifNeeded := admissionregistrationv1.IfNeededReinvocationPolicy
	timeout := int32(5)
	selector := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
		Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn,
		Values: append([]string{"kube-system", "kube-node-lease", releaseNS}, excluded...)}}}
	rule := func(groups []string, ops []admissionregistrationv1.OperationType, resources ...string) admissionregistrationv1.RuleWithOperations {
		return admissionregistrationv1.RuleWithOperations{Operations: ops, Rule: admissionregistrationv1.Rule{
			APIGroups: groups, APIVersions: []string{"v1"}, Resources: resources}}
	}
	create, update := admissionregistrationv1.Create, admissionregistrationv1.Update
	return &WebhookConfigurations{
		Mutating: &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "gpuguard"},
			Webhooks: []admissionregistrationv1.MutatingWebhook{{
				Name: "mutate.gpuguard.io", ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: path("/mutate")},
				Rules: []admissionregistrationv1.RuleWithOperations{
					rule([]string{""}, []admissionregistrationv1.OperationType{create}, "pods"),
					rule([]string{""}, []admissionregistrationv1.OperationType{update}, "pods/ephemeralcontainers")},
				FailurePolicy: &ignore, ReinvocationPolicy: &ifNeeded, SideEffects: &none, TimeoutSeconds: &timeout,
				AdmissionReviewVersions: []string{"v1"}, NamespaceSelector: selector}}},
		Validating: &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "gpuguard"},
			Webhooks: []admissionregistrationv1.ValidatingWebhook{{
				Name: "validate-pods.gpuguard.io", ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: path("/validate")},
				Rules: []admissionregistrationv1.RuleWithOperations{
					rule([]string{""}, []admissionregistrationv1.OperationType{create, update}, "pods"),
					rule([]string{""}, []admissionregistrationv1.OperationType{update}, "pods/ephemeralcontainers")},
				FailurePolicy: &fail, SideEffects: &none, TimeoutSeconds: &timeout,
				AdmissionReviewVersions: []string{"v1"}, NamespaceSelector: selector,
			}, {
				Name: "validate-controllers.gpuguard.io", ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: path("/validate")},
				Rules: []admissionregistrationv1.RuleWithOperations{
					rule([]string{"apps"}, []admissionregistrationv1.OperationType{create, update}, "deployments", "replicasets", "statefulsets", "daemonsets"),
					rule([]string{"batch"}, []admissionregistrationv1.OperationType{create, update}, "jobs", "cronjobs"),
					rule([]string{""}, []admissionregistrationv1.OperationType{create, update}, "replicationcontrollers", "podtemplates")},
				FailurePolicy: &ignore, SideEffects: &none, TimeoutSeconds: &timeout,
				AdmissionReviewVersions: []string{"v1"}, NamespaceSelector: selector}}},
	}, nil
}
