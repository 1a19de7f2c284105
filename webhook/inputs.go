package webhook

import (
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/internal/backgroundaudit"
	"github.com/gpuguard/gpuguard/internal/backstop"
	"github.com/gpuguard/gpuguard/internal/lookup"
	"github.com/gpuguard/gpuguard/internal/policysource"
	"github.com/gpuguard/gpuguard/policy"
)

// reviewInputs read what a review needs besides its object. They are nil
// standalone, where namespace labels and ConfigMaps are unknown (interfaces,
// not pointers, so that nil stays nil in the Handler).
type reviewInputs struct {
	namespaces NamespaceLabels
	configMaps policy.ConfigMapSource
	// ready fails until the namespace cache has synced.
	ready healthz.Checker
}

// watchCluster adds to mgr the policy ConfigMap's reconciler, the CEL
// backstop's apply and the background audit where asked for, and the caches
// reviews read namespace labels and ConfigMaps from.
func watchCluster(mgr manager.Manager, o Options, source *policysource.Source, m *Metrics) (reviewInputs, error) {
	reconciler := &policysource.Reconciler{
		Key: o.PolicyConfigMap, Reader: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Source: source,
		Events: mgr.GetEventRecorder("gpuguard"), Reloads: m.PolicyReloads, MissingExemptNS: m.MissingExemptNS, Log: o.Log.WithName("policy"),
		FallbackInForce: m.PolicyFallback,
	}
	if o.PolicyFallback {
		reconciler.Fallback = config.DefaultYAML()
	}
	if o.CELBackstop != nil {
		sync := &backstop.Sync{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Options: *o.CELBackstop, Owner: o.ValidatingConfig,
			Source: source, Syncs: m.BackstopSyncs, Log: o.Log.WithName("backstop")}
		reconciler.Apply = sync.Apply
		if err := mgr.Add(sync); err != nil {
			return reviewInputs{}, err
		}
	}
	if err := reconciler.Setup(mgr); err != nil {
		return reviewInputs{}, err
	}
	if o.Audit != nil {
		runner, err := backgroundaudit.New(mgr, source, o.PolicyConfigMap.Namespace, *o.Audit,
			backgroundaudit.Metrics{Runs: m.AuditRuns, Objects: m.AuditObjects}, o.Log.WithName("audit"))
		if err != nil {
			return reviewInputs{}, err
		}
		if err := mgr.Add(runner); err != nil {
			return reviewInputs{}, err
		}
	}
	namespaces := lookup.NewNamespaces(mgr.GetCache(), mgr.GetAPIReader(), o.APIReadTimeout)
	in := reviewInputs{namespaces: namespaces, ready: namespaces.Ready,
		configMaps: lookup.NewConfigMaps(mgr.GetAPIReader(), o.ConfigMapCacheTTL, o.APIReadTimeout, m.ConfigMapLookups)}
	return in, mgr.Add(namespaces)
}
