package webhook

import (
	"context"
	"encoding/json"

	"github.com/go-logr/logr"
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
	client  client.Client
	options cel.Options
	metrics *Metrics
	log     logr.Logger
	// applied is the hash of the policy last applied.
	applied string
}

// fieldOwner is the server-side apply field manager of the backstop objects.
const fieldOwner = "gpuguard"

func (b *backstopSync) apply(ctx context.Context, p *config.Policy) error {
	policies, err := cel.Render(p, b.options)
	if err == nil {
		for _, obj := range policies.Objects() {
			if err = b.applyOne(ctx, obj.(client.Object)); err != nil {
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
	b.log.Info("CEL backstop applied", "name", b.options.Name)
	return nil
}

func (b *backstopSync) applyOne(ctx context.Context, obj client.Object) error {
	data, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	return b.client.Patch(ctx, obj, client.RawPatch(types.ApplyPatchType, data), client.FieldOwner(fieldOwner), client.ForceOwnership)
}
