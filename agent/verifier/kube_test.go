package verifier

import (
	"context"
	"slices"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpuguard/gpuguard/internal/wellknown"
)

var schemaPods = schema.GroupResource{Resource: "pods"}

func TestKubeEventNamesTheContainerAndGPU(t *testing.T) {
	client := fake.NewClientset()
	k := Kube{Client: client, Node: "gpu-node-1"}
	f := Finding{Container: Container{ID: "c1", PodUID: "u1", Key: key("team-a", "leak", "main")},
		GPU: Reached{UUID: "GPU-2", Path: "/dev/nvidia2"}, Allocated: []string{"GPU-1"}}
	f2 := f
	f2.GPU = Reached{UUID: "GPU-3", Path: "/dev/nvidia3"}
	if err := k.Event(context.Background(), []Finding{f, f2}); err != nil {
		t.Fatal(err)
	}
	evs, err := client.CoreV1().Events("team-a").List(context.Background(), metav1.ListOptions{})
	if err != nil || len(evs.Items) != 1 {
		t.Fatalf("events %v, %v; want one", evs, err)
	}
	ev := evs.Items[0]
	if ev.Reason != wellknown.ReasonUnallocatedGPUAccess || ev.Type != "Warning" || ev.InvolvedObject.Name != "leak" || string(ev.InvolvedObject.UID) != "u1" ||
		ev.InvolvedObject.FieldPath != "spec.containers{main}" || !strings.Contains(ev.Message, "GPU-2 (/dev/nvidia2)") || !strings.Contains(ev.Message, "GPU-3") || !strings.Contains(ev.Message, "allocated it GPU-1") {
		t.Errorf("event %+v", ev)
	}
}

// stopRecorder records the containers the runtime was asked to stop.
type stopRecorder struct {
	stopped []string
	err     error
}

func (r *stopRecorder) StopContainer(_ context.Context, id string) error {
	r.stopped = append(r.stopped, id)
	return r.err
}

// TestKubeStopKillsThenDeletes: the container is stopped through the
// runtime and the pod deleted with a one-second grace and its UID as a
// precondition, never through the Eviction API that a PodDisruptionBudget
// holds back; a pod gone or replaced is no error, a refusal is.
func TestKubeStopKillsThenDeletes(t *testing.T) {
	f := Finding{Container: Container{ID: "c1", PodUID: "u1", Key: key("team-a", "leak", "main")}}
	for _, c := range []struct {
		name  string
		err   error
		fails bool
	}{
		{"deleted", nil, false},
		{"gone already", apierrors.NewNotFound(schemaPods, "leak"), false},
		{"replaced (another UID)", apierrors.NewConflict(schemaPods, "leak", nil), false},
		{"forbidden", apierrors.NewForbidden(schemaPods, "leak", nil), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			client := fake.NewClientset()
			var deleted *metav1.DeleteOptions
			client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
				if a.GetSubresource() == "eviction" {
					t.Error("an eviction was sent: a PodDisruptionBudget could hold it back")
				}
				return false, nil, nil
			})
			client.PrependReactor("delete", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
				opts := a.(k8stesting.DeleteActionImpl).GetDeleteOptions()
				deleted = &opts
				return true, nil, c.err
			})
			rt := &stopRecorder{}
			err := Kube{Client: client, Runtime: func() ContainerStopper { return rt }}.Stop(context.Background(), f)
			if (err != nil) != c.fails {
				t.Errorf("err = %v, want failure %v", err, c.fails)
			}
			if !slices.Equal(rt.stopped, []string{"c1"}) {
				t.Errorf("runtime stopped %v, want [c1]", rt.stopped)
			}
			if deleted == nil || deleted.GracePeriodSeconds == nil || *deleted.GracePeriodSeconds != 1 ||
				deleted.Preconditions == nil || deleted.Preconditions.UID == nil || *deleted.Preconditions.UID != "u1" {
				t.Errorf("delete options %+v, want a 1 s grace and UID u1 as precondition", deleted)
			}
		})
	}
}
