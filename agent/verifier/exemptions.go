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
	Namespaces []string
	// Waivers are the service account exemptions, with the rules each
	// waives.
	Waivers policy.Waivers
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
	// A policy in force has been validated: its waivers are well formed.
	e.Waivers, _ = policy.NewWaivers(&p.Spec)
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

// KAIGroups are the GPU groups KAI's binder bound container c's pod to
// (policy.KAIGPUGroups), read from its pod as stored; none where the pod
// cannot be read or the integration is off.
func (e *Exemptions) KAIGroups(ctx context.Context, c Container) []string {
	e.mu.Lock()
	kai := e.KAI
	e.mu.Unlock()
	if !kai.Fractions || e.Client == nil {
		return nil
	}
	pod := e.podOf(ctx, c).pod
	if pod == nil {
		return nil
	}
	return policy.KAIGPUGroups(pod)
}

// Of names the exemption covering a container's pod, with the rules it
// waives (nil: every rule), or returns "".
func (e *Exemptions) Of(ctx context.Context, c Container) (string, policy.RuleSet) {
	e.mu.Lock()
	namespaces, waivers := e.Namespaces, e.Waivers
	e.mu.Unlock()
	ns := c.Key.Namespace
	if slices.Contains(namespaces, ns) {
		return "namespace " + ns, nil
	}
	if len(waivers) == 0 || e.Client == nil {
		return "", nil
	}
	sa := e.podOf(ctx, c).serviceAccount
	if sa == "" {
		return "", nil
	}
	if rules, ok := waivers.Of(config.ServiceAccountRef{Namespace: ns, Name: sa}); ok {
		return "service account " + ns + "/" + sa, rules
	}
	return "", nil
}

// OfGPUs names the exemption that lets a container reach GPUs the kubelet
// did not allocate to it, or returns "": one that waives every rule, or the
// rule admission would have kept those GPUs from it by. With nothing
// allocated that is inject-void (the image's NVIDIA_VISIBLE_DEVICES=all
// stands); with an allocation, device-env (a device list of its own).
func (e *Exemptions) OfGPUs(ctx context.Context, c Container, allocated bool) string {
	name, rules := e.Of(ctx, c)
	rule := policy.RuleInjectVoid
	if allocated {
		rule = policy.RuleDeviceEnv
	}
	if name == "" || (rules != nil && !rules[rule]) {
		return ""
	}
	return name
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
