// Package prefilter keeps the pre-filter (cel.Prefilter) on gpuguard's pod
// webhooks, as a match condition, so that the API server calls them only for
// pods the policy in force has something to say about.
package prefilter

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpuguard/gpuguard/cel"
	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/internal/wellknown"
)

// Sync applies the pre-filter rendered from a policy to the named webhooks.
type Sync struct {
	Client client.Client
	// Reader reads the configurations straight from the API server.
	Reader client.Reader
	// MutatingConfig and ValidatingConfig name gpuguard's webhook
	// configurations; Webhooks the webhooks in them to filter (the pod
	// webhooks). Each must be in one of them.
	MutatingConfig, ValidatingConfig string
	Webhooks                         []string
	// Syncs counts applies by result: success or error.
	Syncs *prometheus.CounterVec
	Log   logr.Logger
}

// Apply renders the policy's pre-filter and applies it server-side to every
// named webhook. Until it first lands the webhooks see every pod, which is
// safe; a policy edit reaches them here, right after the policy loads.
func (s *Sync) Apply(ctx context.Context, p *config.Policy) error {
	err := s.apply(ctx, p)
	if err != nil {
		s.Syncs.WithLabelValues("error").Inc()
		s.Log.Error(err, "pre-filter not updated; the webhooks keep the match condition they had")
		return fmt.Errorf("pre-filter: %w", err)
	}
	s.Syncs.WithLabelValues("success").Inc()
	s.Log.V(1).Info("pre-filter applied", "webhooks", s.Webhooks)
	return nil
}

func (s *Sync) apply(ctx context.Context, p *config.Policy) error {
	expr, err := cel.Prefilter(p)
	if err != nil {
		return err
	}
	found := map[string]bool{}
	for _, target := range []struct{ kind, name string }{
		{"MutatingWebhookConfiguration", s.MutatingConfig},
		{"ValidatingWebhookConfiguration", s.ValidatingConfig},
	} {
		if target.name == "" {
			continue
		}
		names, err := s.webhookNames(ctx, target.kind, target.name)
		if err != nil {
			return fmt.Errorf("reading %s %s: %w", target.kind, target.name, err)
		}
		var filtered []string
		for _, n := range names {
			if slices.Contains(s.Webhooks, n) {
				filtered, found[n] = append(filtered, n), true
			}
		}
		if err := s.patch(ctx, target.kind, target.name, filtered, expr); err != nil {
			return fmt.Errorf("applying to %s %s: %w", target.kind, target.name, err)
		}
	}
	for _, n := range s.Webhooks {
		if !found[n] {
			return fmt.Errorf("webhook %s is in neither %s nor %s", n, s.MutatingConfig, s.ValidatingConfig)
		}
	}
	return nil
}

// webhookNames lists the webhooks of a configuration.
func (s *Sync) webhookNames(ctx context.Context, kind, name string) ([]string, error) {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(admissionregistrationv1.SchemeGroupVersion.WithKind(kind))
	if err := s.Reader.Get(ctx, client.ObjectKey{Name: name}, u); err != nil {
		return nil, err
	}
	webhooks, _, err := unstructured.NestedSlice(u.Object, "webhooks")
	if err != nil {
		return nil, err
	}
	var names []string
	for _, w := range webhooks {
		if m, ok := w.(map[string]any); ok {
			if n, ok := m["name"].(string); ok {
				names = append(names, n)
			}
		}
	}
	return names, nil
}

// patch applies the condition to the webhooks of one configuration: an
// apply configuration holding only their names and that one condition.
// Webhooks no longer named lose it, as the field manager no longer applies
// it to them.
func (s *Sync) patch(ctx context.Context, kind, name string, webhooks []string, expr string) error {
	entries := []map[string]any{}
	for _, w := range webhooks {
		entries = append(entries, map[string]any{"name": w, "matchConditions": []map[string]string{{"name": cel.PrefilterName, "expression": expr}}})
	}
	body, err := json.Marshal(map[string]any{
		"apiVersion": admissionregistrationv1.SchemeGroupVersion.String(), "kind": kind,
		"metadata": map[string]any{"name": name}, "webhooks": entries,
	})
	if err != nil {
		return err
	}
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(admissionregistrationv1.SchemeGroupVersion.WithKind(kind))
	obj.SetName(name)
	return s.Client.Patch(ctx, obj, client.RawPatch(types.ApplyPatchType, body), client.FieldOwner(wellknown.PrefilterFieldManager), client.ForceOwnership)
}
