package enforcer

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuguard/gpuguard/internal/wellknown"
)

// DefaultLeaseDuration is how long a node enforcer's Lease stays fresh
// without renewal; it is renewed every third of it.
const DefaultLeaseDuration = wellknown.CoverageLeaseSeconds * time.Second

// Lease is the node enforcer's heartbeat: a Lease named after the node,
// held by the node while the enforcer is registered with the runtime, and
// released when it is not. The webhook's hardened-cluster profile counts a
// GPU node as covered while its Lease is fresh; a Lease that is not renewed
// goes stale on its own, so a dead agent stops counting within a duration.
//
// The agent holds one of its own the same way, named with
// wellknown.AgentLeasePrefix, while it publishes its node's labels: the
// heartbeat of the hardened mark.
type Lease struct {
	Client    kubernetes.Interface
	Namespace string
	Node      string
	// Name is the Lease's name; "" is the node enforcer's,
	// wellknown.EnforcerLeasePrefix and the node's name.
	Name     string
	Duration time.Duration
	Log      logr.Logger
	// Covers, when set, says whether the node is covered at all: the
	// Lease is held only while it reports true, and released (renewed
	// with no holder) while it reports false. For the enforcer's Lease it
	// is whether the runtime requires the enforcer: where it does not, a
	// container created while the enforcer is away (agent restart, OOM,
	// containerd restart, a decision past NRI's timeout) is created as
	// its pod says, so admission must not count on the enforcer.
	Covers func() bool
}

// Hold renews the Lease until ctx ends, then releases it.
func (l *Lease) Hold(ctx context.Context) {
	t := time.NewTicker(l.Duration / 3)
	defer t.Stop()
	covered := true
	for {
		holder := l.Node
		if now := l.Covers == nil || l.Covers(); now != covered {
			covered = now
			l.Log.Info("Lease coverage changed", "lease", l.name(), "covered", covered,
				"reason", "the node counts as covered only while its runtime requires the enforcer (hardening check gpuguard_nri_required)")
		}
		if !covered {
			holder = ""
		}
		if err := l.write(ctx, holder); err != nil && ctx.Err() == nil {
			l.Log.Error(err, "Lease not renewed")
		}
		select {
		case <-ctx.Done():
			release, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := l.write(release, ""); err != nil {
				l.Log.Info("Lease not released; it goes stale on its own", "reason", err.Error())
			}
			return
		case <-t.C:
		}
	}
}

// write sets the Lease's holder ("" releases it) and renewal time.
func (l *Lease) write(ctx context.Context, holder string) error {
	leases := l.Client.CoordinationV1().Leases(l.Namespace)
	name := l.name()
	seconds := int32(l.Duration / time.Second)
	now := metav1.NewMicroTime(time.Now())
	spec := coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &seconds, RenewTime: &now}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cur, err := leases.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: l.Namespace}, Spec: spec}, metav1.CreateOptions{})
	case err == nil:
		cur.Spec = spec
		_, err = leases.Update(ctx, cur, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("Lease %s/%s: %w", l.Namespace, name, err)
	}
	return nil
}

// name is the Lease's name: Name, else the node enforcer's.
func (l *Lease) name() string {
	if l.Name != "" {
		return l.Name
	}
	return wellknown.EnforcerLeasePrefix + l.Node
}
