package verifier

import (
	"context"
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

func TestKubeEvictHonoursDisruptionBudgets(t *testing.T) {
	f := Finding{Container: Container{PodUID: "u1", Key: key("team-a", "leak", "main")}}
	for _, c := range []struct {
		name    string
		err     error
		refused bool
		fails   bool
	}{
		{"evicted", nil, false, false},
		{"a PodDisruptionBudget holds it", apierrors.NewTooManyRequests("disruption budget", 10), true, false},
		{"gone already", apierrors.NewNotFound(schemaPods, "leak"), false, false},
		{"forbidden", apierrors.NewForbidden(schemaPods, "leak", nil), false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			client := fake.NewClientset()
			var sent bool
			client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
				if a.GetSubresource() == "eviction" {
					sent = true
					return true, nil, c.err
				}
				return false, nil, nil
			})
			refused, err := Kube{Client: client}.Evict(context.Background(), f)
			if !sent || refused != c.refused || (err != nil) != c.fails {
				t.Errorf("sent=%v refused=%v err=%v; want sent, refused=%v, fails=%v", sent, refused, err, c.refused, c.fails)
			}
		})
	}
}
