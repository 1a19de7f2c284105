package verifier

import (
	"context"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/policy"
)

// Exemptions apply the policy's exemptions to findings, as admission does:
// by namespace, and by the pod's namespace and service account together. The
// CRI does not carry a pod's service account, so the pod is read from the API
// server, only for a container with a finding, once per pod.
type Exemptions struct {
	Namespaces      []string
	ServiceAccounts []config.ServiceAccountRef
	// KAI is the policy's KAI Scheduler integration: with fractions on, the
	// fraction container of a pod KAI scheduled may reach as many GPUs as
	// its fraction spans, without a kubelet allocation.
	KAI config.KAIScheduler
	// Client reads pods; nil leaves service account exemptions and KAI
	// fractions unchecked.
	Client kubernetes.Interface

	mu   sync.Mutex
	pods map[string]podFacts // by pod UID
}

// podFacts are what the verifier reads of a pod, once.
type podFacts struct {
	serviceAccount string
	pod            *corev1.Pod
}

// Set takes the policy's exemptions, plus namespaces the agent is told to
// leave out; the pods already read are kept.
func (e *Exemptions) Set(p *config.Policy, extraNamespaces []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.Namespaces = slices.Concat(p.Spec.Exemptions.Namespaces, extraNamespaces)
	e.ServiceAccounts = p.Spec.Exemptions.ServiceAccounts
	e.KAI = p.Spec.Integrations.KAIScheduler
}

// KAIFraction is how many GPUs container c may reach without an allocation
// as the fraction container of a pod KAI Scheduler scheduled (its
// gpu-fraction-num-devices, else 1), with the integration on; 0 otherwise.
// KAI, not the kubelet, accounts for those GPUs, and admission let the
// container take only the device list KAI's binder wrote for it.
func (e *Exemptions) KAIFraction(ctx context.Context, c Container) int {
	e.mu.Lock()
	kai := e.KAI
	e.mu.Unlock()
	if !kai.Fractions || e.Client == nil {
		return 0
	}
	pod := e.podOf(ctx, c).pod
	if pod == nil {
		return 0
	}
	return policy.KAIFractionDevices(pod, c.Key.Container, kai.SchedulerNames)
}

// Of names the exemption covering a container's pod, or "".
func (e *Exemptions) Of(ctx context.Context, c Container) string {
	e.mu.Lock()
	namespaces, accounts := e.Namespaces, e.ServiceAccounts
	e.mu.Unlock()
	ns := c.Key.Namespace
	if slices.Contains(namespaces, ns) {
		return "namespace " + ns
	}
	if len(accounts) == 0 || e.Client == nil {
		return ""
	}
	sa := e.podOf(ctx, c).serviceAccount
	if sa != "" && slices.Contains(accounts, config.ServiceAccountRef{Namespace: ns, Name: sa}) {
		return "service account " + ns + "/" + sa
	}
	return ""
}

// podOf reads c's pod from the API server, once per pod; the zero value
// when it cannot be read (then it is asked again next pass).
func (e *Exemptions) podOf(ctx context.Context, c Container) podFacts {
	e.mu.Lock()
	facts, ok := e.pods[c.PodUID]
	e.mu.Unlock()
	if ok {
		return facts
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pod, err := e.Client.CoreV1().Pods(c.Key.Namespace).Get(ctx, c.Key.Pod, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return podFacts{} // gone; not cached, a pod of the same name may come
	case err != nil:
		return podFacts{} // unknown: reported, and asked again next pass
	case string(pod.UID) != c.PodUID:
		return podFacts{}
	}
	facts = podFacts{serviceAccount: pod.Spec.ServiceAccountName, pod: pod}
	if facts.serviceAccount == "" {
		facts.serviceAccount = "default"
	}
	e.mu.Lock()
	if e.pods == nil {
		e.pods = map[string]podFacts{}
	}
	e.pods[c.PodUID] = facts
	e.mu.Unlock()
	return facts
}
