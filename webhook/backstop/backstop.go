// Package backstop keeps gpuguard's CEL backstop applied in the cluster.
package backstop

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpuguard/gpuguard/cel"
	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/internal/wellknown"
)

// Sync keeps the CEL backstop (ValidatingAdmissionPolicy and
// MutatingAdmissionPolicy with their bindings) in step with the policy in force,
// by server-side apply after every load, and periodically (the webhook's
// reapplier) so that an object deleted or edited by hand comes back. The
// webhook renders it with the same code as `gpuguard render-cel`, from the
// live ConfigMap, so an edit reaches both at once and there is one source of
// truth. The objects outlive the webhook: that is the point of a backstop.
type Sync struct {
	Client client.Client
	// Reader reads the owner straight from the API server, without a watch.
	Reader  client.Reader
	Options cel.Options
	// Syncs counts applies by result: success or error.
	Syncs *prometheus.CounterVec
	Log   logr.Logger
	// Owner, when set, names the ClusterRole that owns the backstop
	// objects, so that removing gpuguard (helm uninstall deletes the
	// webhook's ClusterRole) garbage-collects them too. Not the webhook
	// configuration: deleting that is the usual runbook step when a webhook
	// blocks a cluster, and the backstop must outlive it.
	Owner string

	// guardGone: the KAI ConfigMap guard is known absent (deleted, or never
	// applied, by this process), so a policy without the integration needs
	// no DELETE on every reapply. The reconciler and the reapplier both
	// apply, hence atomic.
	guardGone atomic.Bool
}

// Apply renders the policy's backstop and applies it server-side.
func (b *Sync) Apply(ctx context.Context, p *config.Policy) error {
	policies, err := cel.Render(p, b.Options)
	var owners []metav1.OwnerReference
	if err == nil {
		owners, err = b.ownerReferences(ctx)
	}
	if err == nil {
		for _, obj := range policies.Objects() {
			o := obj.(client.Object)
			o.SetOwnerReferences(owners)
			if err = b.applyOne(ctx, o); err != nil {
				break
			}
		}
	}
	switch {
	case err == nil && policies.KAIGuard != nil:
		b.guardGone.Store(false)
	case err == nil && !b.guardGone.Load():
		// Left by a policy with the integration on, here or before a restart.
		if err = b.deleteKAIGuard(ctx); err == nil {
			b.guardGone.Store(true)
		}
	}
	if err != nil {
		b.Syncs.WithLabelValues("error").Inc()
		b.Log.Error(err, "CEL backstop not updated; the objects in the cluster stay as they were")
		return err
	}
	b.Syncs.WithLabelValues("success").Inc()
	b.Log.V(1).Info("CEL backstop applied", "name", b.Options.Name)
	return nil
}

func (b *Sync) ownerReferences(ctx context.Context) ([]metav1.OwnerReference, error) {
	if b.Owner == "" {
		return nil, nil
	}
	role := &rbacv1.ClusterRole{}
	if err := b.Reader.Get(ctx, client.ObjectKey{Name: b.Owner}, role); err != nil {
		return nil, fmt.Errorf("looking up the owner of the backstop, ClusterRole %s: %w", b.Owner, err)
	}
	return []metav1.OwnerReference{{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole",
		Name: role.Name, UID: role.UID}}, nil
}

func (b *Sync) applyOne(ctx context.Context, obj client.Object) error {
	data, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	return b.Client.Patch(ctx, obj, client.RawPatch(types.ApplyPatchType, data), client.FieldOwner(wellknown.BackstopFieldManager), client.ForceOwnership)
}

// deleteKAIGuard removes the KAI integration's ConfigMap guard, left from a
// policy that had the integration on; absent objects are fine.
func (b *Sync) deleteKAIGuard(ctx context.Context) error {
	name := cel.KAIGuardName(b.Options.Name)
	for _, obj := range []client.Object{
		&admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: name}},
		&admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}},
	} {
		if err := b.Client.Delete(ctx, obj); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting the KAI ConfigMap guard %s: %w", name, err)
		}
	}
	return nil
}
