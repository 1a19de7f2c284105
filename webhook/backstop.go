package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpuguard/gpuguard/cel"
	"github.com/gpuguard/gpuguard/config"
)

// backstopSync keeps the CEL backstop (ValidatingAdmissionPolicy and
// MutatingAdmissionPolicy with their bindings) in step with the policy in force,
// by server-side apply after every load. The webhook renders it with the same
// code as `gpuguard render-cel`, from the live ConfigMap, so an edit reaches both
// at once and there is one source of truth. The objects outlive the webhook: that
// is the point of a backstop.
type backstopSync struct {
	client client.Client
	// reader reads the owner straight from the API server, without a watch.
	reader  client.Reader
	options cel.Options
	metrics *Metrics
	log     logr.Logger
	// owner, when set, names the ValidatingWebhookConfiguration that owns the
	// backstop objects, so that removing gpuguard (helm uninstall deletes that
	// configuration) garbage-collects them too.
	owner string
	// source is the policy in force, re-applied periodically.
	source *PolicySource
	// applied is the hash of the policy last applied.
	applied string
}

// reapplyEvery is how often the backstop is applied again, whatever happened: a
// policy or binding deleted or edited by hand comes back within this time.
const reapplyEvery = time.Minute

// Start re-applies the backstop periodically until ctx is done (manager.Runnable).
func (b *backstopSync) Start(ctx context.Context) error {
	tick := time.NewTicker(reapplyEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			if e := b.source.Engine(); e != nil {
				_ = b.apply(ctx, e.Policy()) // logged and counted in apply
			}
		}
	}
}

// fieldOwner is the server-side apply field manager of the backstop objects.
const fieldOwner = "gpuguard"

func (b *backstopSync) apply(ctx context.Context, p *config.Policy) error {
	policies, err := cel.Render(p, b.options)
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
	if err != nil {
		b.metrics.BackstopSyncs.WithLabelValues("error").Inc()
		b.log.Error(err, "CEL backstop not updated; the objects in the cluster stay as they were")
		return err
	}
	b.metrics.BackstopSyncs.WithLabelValues("success").Inc()
	b.log.V(1).Info("CEL backstop applied", "name", b.options.Name)
	return nil
}

func (b *backstopSync) ownerReferences(ctx context.Context) ([]metav1.OwnerReference, error) {
	if b.owner == "" {
		return nil, nil
	}
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := b.reader.Get(ctx, client.ObjectKey{Name: b.owner}, vwc); err != nil {
		return nil, fmt.Errorf("looking up the owner of the backstop, ValidatingWebhookConfiguration %s: %w", b.owner, err)
	}
	return []metav1.OwnerReference{{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingWebhookConfiguration",
		Name: vwc.Name, UID: vwc.UID}}, nil
}

func (b *backstopSync) applyOne(ctx context.Context, obj client.Object) error {
	data, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	return b.client.Patch(ctx, obj, client.RawPatch(types.ApplyPatchType, data), client.FieldOwner(fieldOwner), client.ForceOwnership)
}
