package verify

import (
	"context"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuguard/gpuguard/config"
)

// Exemptions apply the policy's exemptions to findings, as admission does:
// by namespace, and by the pod's namespace and service account together. The
// CRI does not carry a pod's service account, so the pod is read from the API
// server, only for a container with a finding, once per pod.
type Exemptions struct {
	Namespaces      []string
	ServiceAccounts []config.ServiceAccountRef
	// Client reads pods; nil leaves service account exemptions unchecked.
	Client kubernetes.Interface

	mu  sync.Mutex
	sas map[string]string // pod UID -> service account
}

// Set takes the policy's exemptions, plus namespaces the agent is told to
// leave out; the service accounts of pods already read are kept.
func (e *Exemptions) Set(p *config.Policy, extraNamespaces []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.Namespaces = slices.Concat(p.Spec.Exemptions.Namespaces, extraNamespaces)
	e.ServiceAccounts = p.Spec.Exemptions.ServiceAccounts
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
	sa := e.serviceAccount(ctx, c)
	if sa != "" && slices.Contains(accounts, config.ServiceAccountRef{Namespace: ns, Name: sa}) {
		return "service account " + ns + "/" + sa
	}
	return ""
}

func (e *Exemptions) serviceAccount(ctx context.Context, c Container) string {
	e.mu.Lock()
	sa, ok := e.sas[c.PodUID]
	e.mu.Unlock()
	if ok {
		return sa
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pod, err := e.Client.CoreV1().Pods(c.Key.Namespace).Get(ctx, c.Key.Pod, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "" // gone; not cached, a pod of the same name may come
	case err != nil:
		return "" // unknown: reported, and asked again next pass
	case string(pod.UID) != c.PodUID:
		return ""
	}
	sa = pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	e.mu.Lock()
	if e.sas == nil {
		e.sas = map[string]string{}
	}
	e.sas[c.PodUID] = sa
	e.mu.Unlock()
	return sa
}
