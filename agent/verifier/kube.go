package verifier

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuguard/gpuguard/internal/wellknown"
)

// Kube records Events through the API server and, in enforce mode, stops
// containers through the runtime and deletes their pods.
type Kube struct {
	Client kubernetes.Interface
	Node   string
	// Runtime is the node's runtime once the verifier has dialled it; nil,
	// or returning nil, until then (the pod is deleted all the same).
	Runtime func() ContainerStopper
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

// ContainerStopper stops a container through the node's runtime.
type ContainerStopper interface {
	StopContainer(ctx context.Context, id string) error
}

// deleteGrace is the grace period of the deletion that follows a stop: the
// container is already killed, and one second lets the kubelet record that
// before the API object goes, where a grace of 0 would remove the object at
// once and leave the kubelet to find out.
const deleteGrace = int64(1)

// Stop ends the finding's container at once through the runtime (no grace:
// SIGKILL) and deletes its pod with a one-second grace period. Neither goes
// through the Eviction API, so no PodDisruptionBudget, and not the pod's own
// terminationGracePeriodSeconds nor a process that ignores SIGTERM, keeps
// a container that reaches GPUs it was not allocated running. A pod already
// gone, or replaced (another UID), is no error.
func (k Kube) Stop(ctx context.Context, f Finding) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c := f.Container
	var errs []error
	if k.Runtime != nil {
		if rt := k.Runtime(); rt != nil {
			if err := rt.StopContainer(ctx, c.ID); err != nil {
				errs = append(errs, fmt.Errorf("stopping container %s: %w", c.ID, err))
			}
		}
	}
	grace, uid := deleteGrace, types.UID(c.PodUID)
	err := k.Client.CoreV1().Pods(c.Key.Namespace).Delete(ctx, c.Key.Pod,
		metav1.DeleteOptions{GracePeriodSeconds: &grace, Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		errs = append(errs, fmt.Errorf("deleting pod %s/%s: %w", c.Key.Namespace, c.Key.Pod, err))
	}
	return errors.Join(errs...)
}
