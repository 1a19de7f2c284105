package policysource

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/gpuguard/gpuguard/internal/wellknown"
)

// TestNodeHardeningChanged: only a Node's labels and allocatable can change
// the hardening; its status heartbeats do not.
func TestNodeHardeningChanged(t *testing.T) {
	base := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"nvidia.com/gpu.present": "true"}},
		Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("8")}}}
	for _, tc := range []struct {
		name   string
		change func(n *corev1.Node)
		want   bool
	}{
		{"a status heartbeat", func(n *corev1.Node) {
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, LastHeartbeatTime: metav1.Now()}}
			n.ResourceVersion = "2"
		}, false},
		{"the hardened mark", func(n *corev1.Node) { n.Labels[wellknown.HardenedMarkLabel] = "true" }, true},
		{"a GPU label removed", func(n *corev1.Node) { delete(n.Labels, "nvidia.com/gpu.present") }, true},
		{"GPUs allocatable", func(n *corev1.Node) { n.Status.Allocatable["nvidia.com/gpu"] = resource.MustParse("7") }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cur := base.DeepCopy()
			tc.change(cur)
			if got := nodeHardeningChanged().Update(event.UpdateEvent{ObjectOld: base, ObjectNew: cur}); got != tc.want {
				t.Errorf("read the hardening again: %v, want %v", got, tc.want)
			}
		})
	}
}

// TestLeaseFreshnessChanged: the renewal of a fresh Lease does not read the
// hardening again (the reconciler looks when it would go stale); a new
// holder or duration, or the renewal of a stale Lease, does.
func TestLeaseFreshnessChanged(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	lease := func(holder string, renewed time.Time, seconds int32) client.Object {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "gpuguard-enforcer-n1"},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &metav1.MicroTime{Time: renewed}, LeaseDurationSeconds: &seconds}}
	}
	fresh := lease("n1", now.Add(-20*time.Second), 60)
	stale := lease("n1", now.Add(-61*time.Second), 60)
	for _, tc := range []struct {
		name     string
		old, cur client.Object
		want     bool
	}{
		{"a fresh Lease renewed", fresh, lease("n1", now, 60), false},
		{"a stale Lease renewed", stale, lease("n1", now, 60), true},
		{"released", fresh, lease("", now, 60), true},
		{"another duration", fresh, lease("n1", now, 30), true},
		{"no renew time before", &coordinationv1.Lease{}, fresh, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := leaseFreshnessChanged(func() time.Time { return now }).Update(event.UpdateEvent{ObjectOld: tc.old, ObjectNew: tc.cur})
			if got != tc.want {
				t.Errorf("read the hardening again: %v, want %v", got, tc.want)
			}
		})
	}
}

// TestGPUSliceNodesChanged: a GPU driver's ResourceSlice coming, going or
// moving to another node reads the hardening again; another driver's
// slices, and updates of a slice's devices, do not.
func TestGPUSliceNodesChanged(t *testing.T) {
	newSlice := func(driver, node string) *resourcev1.ResourceSlice {
		return &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "s"},
			Spec: resourcev1.ResourceSliceSpec{Driver: driver, NodeName: &node}}
	}
	p := gpuSliceNodesChanged([]string{"gpu.nvidia.com"})
	gpu, other := newSlice("gpu.nvidia.com", "n1"), newSlice("nic.example.com", "n1")
	if !p.Create(event.CreateEvent{Object: gpu}) || !p.Delete(event.DeleteEvent{Object: gpu}) {
		t.Error("a GPU driver's slice created or deleted must read the hardening again")
	}
	if p.Create(event.CreateEvent{Object: other}) || p.Delete(event.DeleteEvent{Object: other}) {
		t.Error("another driver's slice must not")
	}
	devices := gpu.DeepCopy()
	devices.Spec.Devices = []resourcev1.Device{{Name: "gpu-0"}}
	if p.Update(event.UpdateEvent{ObjectOld: gpu, ObjectNew: devices}) {
		t.Error("a device update must not")
	}
	if !p.Update(event.UpdateEvent{ObjectOld: gpu, ObjectNew: newSlice("gpu.nvidia.com", "n2")}) {
		t.Error("a GPU slice moved to another node must")
	}
}
