// Package chartrender renders gpuguard's Helm chart client-side, as `helm template`
// does, with the Helm SDK: for the chart's own tests and for the end-to-end suites,
// which install what the chart renders.
package chartrender

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	kubefake "helm.sh/helm/v3/pkg/kube/fake"
	"helm.sh/helm/v3/pkg/releaseutil"
	"helm.sh/helm/v3/pkg/storage"
	"helm.sh/helm/v3/pkg/storage/driver"
	sigsyaml "sigs.k8s.io/yaml"
)

// KubeVersion is the Kubernetes version charts are rendered for: the one the
// end-to-end suites run.
const KubeVersion = "v1.37.2"

// Release is one rendered release.
type Release struct {
	// Manifests are the regular resources, in install order.
	Manifests []releaseutil.Manifest
	// Hooks are the hook manifests, in Helm's order.
	Hooks []Hook
	// Raw is the whole manifest stream, without hooks, as Helm returns it.
	Raw   string
	Notes string
}

// Hook is one hook manifest, such as a helm test pod.
type Hook struct {
	Path, Manifest string
}

// Load loads a chart directory.
func Load(dir string) (*chart.Chart, error) {
	c, err := loader.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("loading the chart %s: %w", dir, err)
	}
	return c, nil
}

// Render renders a release of c. apiVersions lists the optional APIs (such as
// cert-manager.io/v1) the target cluster offers.
func Render(c *chart.Chart, release, namespace string, values map[string]any, apiVersions ...string) (*Release, error) {
	return RenderFor(KubeVersion, c, release, namespace, values, apiVersions...)
}

// RenderFor renders a release of c for a cluster of the given Kubernetes
// version, as helm install does against it.
func RenderFor(kubeVersion string, c *chart.Chart, release, namespace string, values map[string]any, apiVersions ...string) (*Release, error) {
	cfg := &action.Configuration{
		Releases:     storage.Init(driver.NewMemory()),
		KubeClient:   &kubefake.PrintingKubeClient{Out: io.Discard},
		Capabilities: chartutil.DefaultCapabilities,
		Log:          func(string, ...any) {},
	}
	install := action.NewInstall(cfg)
	install.DryRun, install.ClientOnly, install.Replace = true, true, true
	install.ReleaseName, install.Namespace = release, namespace
	kv, err := chartutil.ParseKubeVersion(kubeVersion)
	if err != nil {
		return nil, err
	}
	install.KubeVersion = kv
	install.APIVersions = chartutil.VersionSet(apiVersions)
	rel, err := install.Run(c, values)
	if err != nil {
		return nil, err
	}
	r := &Release{Raw: rel.Manifest, Notes: rel.Info.Notes}
	_, r.Manifests, err = releaseutil.SortManifests(releaseutil.SplitManifests(rel.Manifest), nil, releaseutil.InstallOrder)
	if err != nil {
		return nil, fmt.Errorf("sorting manifests: %w", err)
	}
	for _, h := range rel.Hooks {
		r.Hooks = append(r.Hooks, Hook{Path: h.Path, Manifest: h.Manifest})
	}
	return r, nil
}

// Documents returns every manifest, hooks included when asked (sorted by path),
// one YAML document each. Each ends with a newline, as in the stream Helm applies:
// a literal block scalar at the end of a document keeps its last line break only
// then.
func (r *Release) Documents(withHooks bool) []string {
	var docs []string
	for _, m := range r.Manifests {
		docs = append(docs, m.Content+"\n")
	}
	if withHooks {
		hooks := slices.SortedFunc(slices.Values(r.Hooks), func(a, b Hook) int { return strings.Compare(a.Path, b.Path) })
		for _, h := range hooks {
			docs = append(docs, h.Manifest+"\n")
		}
	}
	return docs
}

// WebhookConfigurationsKey is the key of the ConfigMap that holds the webhook
// configurations the webhook registers itself.
const WebhookConfigurationsKey = "configurations.yaml"

// WebhookConfigurations returns the webhook configurations the webhook
// registers once a replica is ready, one YAML document each: the chart
// renders them into a ConfigMap rather than as resources of the release.
func (r *Release) WebhookConfigurations() ([]string, error) {
	for _, m := range r.Manifests {
		var cm struct {
			Kind     string
			Metadata struct{ Name string }
			Data     map[string]string
		}
		if err := sigsyaml.Unmarshal([]byte(m.Content), &cm); err != nil {
			return nil, fmt.Errorf("%s: %w", m.Name, err)
		}
		if cm.Kind != "ConfigMap" || !strings.HasSuffix(cm.Metadata.Name, "-webhook-configurations") {
			continue
		}
		var docs []string
		for _, d := range releaseutil.SplitManifests(cm.Data[WebhookConfigurationsKey]) {
			docs = append(docs, d+"\n")
		}
		slices.Sort(docs) // SplitManifests returns a map's values
		return docs, nil
	}
	return nil, fmt.Errorf("the chart rendered no ConfigMap of webhook configurations")
}
