package policy

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuguard/gpuguard/config"
)

// exemption names the policy exemption that covers a request, or returns "".
// Pods are matched by namespace and the pod's own service account, never by labels or
// schedulerName, which users control; requests by the requesting user's name. What
// the requester writes (an ephemeral container, annotations added to a running pod,
// a binding's annotations) is not the pod's service account's doing, so a service
// account exemption does not cover it.
func (e *Engine) exemption(namespace, username string, byRequester bool, spec *corev1.PodSpec) string {
	if username != "" && e.exemptUsers[username] {
		return "user " + username
	}
	if e.exemptNamespaces[namespace] {
		return "namespace " + namespace
	}
	if byRequester {
		return ""
	}
	sa := serviceAccountOf(spec)
	if e.exemptSAs[config.ServiceAccountRef{Namespace: namespace, Name: sa}] {
		return "service account " + namespace + "/" + sa
	}
	return ""
}

// serviceAccountOf is the service account a pod runs as, defaulted as the API
// server defaults it.
func serviceAccountOf(spec *corev1.PodSpec) string {
	switch {
	case spec.ServiceAccountName != "":
		return spec.ServiceAccountName
	case spec.DeprecatedServiceAccount != "":
		return spec.DeprecatedServiceAccount
	}
	return "default"
}
