package policysource

import (
	"maps"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/gpuguard/gpuguard/webhook/hardening"
)

// The hardening is read again on the events that can change it, and not on
// the others, which at a fleet's size are most of them: every agent renews
// its Leases every 20 s, and every kubelet reports its Node's status.

// nodeHardeningChanged passes a Node update that can change the verdict:
// its labels (the GPU labels, the hardened mark) or its capacity or
// allocatable (GPU resources), not its status conditions or heartbeats.
func nodeHardeningChanged() predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		old, oldOK := e.ObjectOld.(*corev1.Node)
		cur, curOK := e.ObjectNew.(*corev1.Node)
		if !oldOK || !curOK {
			return true
		}
		return !maps.Equal(old.Labels, cur.Labels) || !equality.Semantic.DeepEqual(old.Status.Allocatable, cur.Status.Allocatable) ||
			!equality.Semantic.DeepEqual(old.Status.Capacity, cur.Status.Capacity)
	}}
}

// leaseFreshnessChanged passes a Lease update that can change the verdict:
// a new holder or duration, or the renewal of a Lease that had gone stale.
// The renewal of a fresh Lease does not: the reconciler reads the
// hardening again when the first Lease it rests on would go stale
// (hardening.Verdict.Until), and then finds the renewal in its cache.
func leaseFreshnessChanged(now func() time.Time) predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		old, oldOK := e.ObjectOld.(*coordinationv1.Lease)
		cur, curOK := e.ObjectNew.(*coordinationv1.Lease)
		if !oldOK || !curOK {
			return true
		}
		o, c := old.Spec, cur.Spec
		if !equalPtr(o.HolderIdentity, c.HolderIdentity) || !equalPtr(o.LeaseDurationSeconds, c.LeaseDurationSeconds) {
			return true
		}
		stale, ok := hardening.StaleAt(o)
		return !ok || !now().Before(stale)
	}}
}

func equalPtr[T comparable](a, b *T) bool {
	return (a == nil) == (b == nil) && (a == nil || *a == *b)
}

// gpuSliceNodesChanged passes the ResourceSlices of a GPU driver (drivers)
// as they come and go, and an update that changes their nodes; not the
// updates of their devices' attributes or health.
func gpuSliceNodesChanged(drivers []string) predicate.Funcs {
	gpuNodes := func(o client.Object) ([]string, bool) {
		driver, nodes, ok := hardening.SliceNodes(o)
		return nodes, ok && slices.Contains(drivers, driver)
	}
	ofGPUDriver := func(o client.Object) bool {
		_, ok := gpuNodes(o)
		return ok
	}
	return predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return ofGPUDriver(e.Object) },
		DeleteFunc:  func(e event.DeleteEvent) bool { return ofGPUDriver(e.Object) },
		GenericFunc: func(e event.GenericEvent) bool { return ofGPUDriver(e.Object) },
		UpdateFunc: func(e event.UpdateEvent) bool {
			old, oldGPU := gpuNodes(e.ObjectOld)
			cur, curGPU := gpuNodes(e.ObjectNew)
			return oldGPU != curGPU || !slices.Equal(old, cur)
		},
	}
}
