package enforcer

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpuguard/gpuguard/internal/wellknown"
)

// TestLeaseHeldOnlyWhileCovered: the enforcer's Lease lets admission leave
// void out on the node, so it is held only while the node fails closed
// (its runtime requires the enforcer). When that stops, the Lease is
// released at its next renewal, and held again once it holds again.
func TestLeaseHeldOnlyWhileCovered(t *testing.T) {
	client := fake.NewClientset()
	var covers atomic.Bool
	l := &Lease{Client: client, Namespace: "gpuguard", Node: "n1", Duration: 30 * time.Millisecond, Log: logr.Discard(), Covers: covers.Load}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Hold(ctx) }()
	defer func() { cancel(); <-done }()

	holderIs := func(want string) {
		t.Helper()
		var last string
		err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
			got, err := client.CoordinationV1().Leases("gpuguard").Get(ctx, wellknown.EnforcerLeasePrefix+"n1", metav1.GetOptions{})
			if err != nil || got.Spec.HolderIdentity == nil {
				return false, nil
			}
			last = *got.Spec.HolderIdentity
			return last == want, nil
		})
		if err != nil {
			t.Fatalf("Lease holder %q, want %q", last, want)
		}
	}
	holderIs("") // the runtime does not require the enforcer: not covered
	covers.Store(true)
	holderIs("n1")
	covers.Store(false)
	holderIs("")
}
