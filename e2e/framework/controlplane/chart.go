package controlplane

import (
	"fmt"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/gpuguard/gpuguard/tools/chartrender"
)

// ReleaseName is the Helm release name the suites render the chart with.
const ReleaseName = "gpuguard"

// GPUGuardWebhooks renders gpuguard's two webhook configurations from the Helm chart
// in chartDir, for a release in releaseNS whose admission.systemNamespaces are the
// excluded namespaces: what the webhook registers once a replica is ready.
func GPUGuardWebhooks(chartDir, releaseNS string, excluded ...string) (*WebhookConfigurations, error) {
	c, err := chartrender.Load(chartDir)
	if err != nil {
		return nil, err
	}
	systemNamespaces := make([]any, len(excluded))
	for i, ns := range excluded {
		systemNamespaces[i] = ns
	}
	// Only the webhook configurations are wanted: the agent, whose grants
	// need the cluster's admission policy API, is left out. They are those of
	// enforce mode (the pods' webhook fails closed), which the suites test;
	// the chart's default, warn, fails open.
	rel, err := chartrender.Render(c, ReleaseName, releaseNS, map[string]any{
		"admission": map[string]any{"systemNamespaces": systemNamespaces}, "agent": map[string]any{"enabled": false},
		"policy": map[string]any{"mode": "enforce"}})
	if err != nil {
		return nil, fmt.Errorf("rendering the chart: %w", err)
	}
	w := &WebhookConfigurations{}
	registered, err := rel.WebhookConfigurations()
	if err != nil {
		return nil, err
	}
	for _, doc := range registered {
		switch {
		case strings.Contains(doc, "\nkind: MutatingWebhookConfiguration"):
			w.Mutating = &admissionregistrationv1.MutatingWebhookConfiguration{}
			err = sigsyaml.UnmarshalStrict([]byte(doc), w.Mutating)
		case strings.Contains(doc, "\nkind: ValidatingWebhookConfiguration"):
			w.Validating = &admissionregistrationv1.ValidatingWebhookConfiguration{}
			err = sigsyaml.UnmarshalStrict([]byte(doc), w.Validating)
		}
		if err != nil {
			return nil, fmt.Errorf("decoding a webhook configuration of the chart: %w", err)
		}
	}
	if w.Mutating == nil || w.Validating == nil {
		return nil, fmt.Errorf("the chart rendered no Mutating- or ValidatingWebhookConfiguration")
	}
	return w, nil
}
