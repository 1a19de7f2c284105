package verifier

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuguard/gpuguard/internal/wellknown"
)

// Kube records Events and evicts pods through the API server.
type Kube struct {
	Client kubernetes.Interface
	Node   string
}

// Event records a Warning Event on the pod of one container's findings.
func (k Kube) Event(ctx context.Context, findings []Finding) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	now := metav1.NewTime(time.Now())
	c := findings[0].Container
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{GenerateName: c.Key.Pod + ".", Namespace: c.Key.Namespace},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: c.Key.Namespace, Name: c.Key.Pod,
			UID: types.UID(c.PodUID), FieldPath: fmt.Sprintf("spec.containers{%s}", c.Key.Container)},
		Reason: wellknown.ReasonUnallocatedGPUAccess, Message: Message(findings), Type: corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: wellknown.Agent, Host: k.Node},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
		ReportingController: wellknown.AgentReportingController, ReportingInstance: k.Node,
	}
	_, err := k.Client.CoreV1().Events(c.Key.Namespace).Create(ctx, ev, metav1.CreateOptions{})
	return err
}

// Evict evicts the finding's pod through the Eviction API, so that
// PodDisruptionBudgets are honoured.
func (k Kube) Evict(ctx context.Context, f Finding) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c := f.Container
	uid := types.UID(c.PodUID)
	ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: c.Key.Pod, Namespace: c.Key.Namespace},
		DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}}
	err := k.Client.PolicyV1().Evictions(c.Key.Namespace).Evict(ctx, ev)
	switch {
	case apierrors.IsTooManyRequests(err):
		return true, nil
	case apierrors.IsNotFound(err):
		return false, nil // gone already
	}
	return false, err
}
