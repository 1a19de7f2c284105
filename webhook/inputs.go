package webhook

import (
	"context"
	"errors"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/policy"
	"github.com/gpuguard/gpuguard/webhook/backgroundaudit"
	"github.com/gpuguard/gpuguard/webhook/backstop"
	"github.com/gpuguard/gpuguard/webhook/hardening"
	"github.com/gpuguard/gpuguard/webhook/lookup"
	"github.com/gpuguard/gpuguard/webhook/policysource"
	"github.com/gpuguard/gpuguard/webhook/prefilter"
	"github.com/gpuguard/gpuguard/webhook/registration"
)

// reviewInputs read what a review needs besides its object. They are nil
// standalone, where namespace labels and ConfigMaps are unknown (interfaces,
// not pointers, so that nil stays nil in the Handler).
type reviewInputs struct {
	namespaces NamespaceLabels
	configMaps policy.ConfigMapSource
	nodes      policy.NodeSource
	// ready fails until the namespace cache has synced.
	ready healthz.Checker
	// registered fails until the webhook configurations are registered;
	// nil where this process does not register them.
	registered healthz.Checker
}

// clusterAppliers are what the webhook keeps in the cluster in step with
// the policy: the CEL backstop, and the pre-filter on its pod webhooks.
func clusterAppliers(mgr manager.Manager, o Config, m *Metrics) []func(context.Context, *config.Policy) error {
	var apply []func(context.Context, *config.Policy) error
	if !o.Role.applies() {
		return nil // a control-role process applies them
	}
	if o.Backstop.Enabled {
		b := &backstop.Sync{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Options: o.Backstop.CEL, Owner: o.Backstop.Owner,
			Syncs: m.BackstopSyncs, Log: o.Log.WithName("backstop")}
		apply = append(apply, b.Apply)
	}
	if len(o.Prefilter.Webhooks) > 0 {
		f := &prefilter.Sync{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), MutatingConfig: o.WebhookConfigurations.Mutating,
			ValidatingConfig: o.WebhookConfigurations.Validating, Webhooks: o.Prefilter.Webhooks, Syncs: m.PrefilterSyncs, Log: o.Log.WithName("prefilter")}
		apply = append(apply, f.Apply)
	}
	return apply
}

// reapplyEvery is how often what the webhook keeps in the cluster is
// applied again, whatever happened: an object deleted or edited by hand
// comes back within this time.
const reapplyEvery = time.Minute

// reapplier applies the policy in force periodically (manager.Runnable);
// the policy reconciler applies it after every load.
type reapplier struct {
	source interface{ Engine() *policy.Engine }
	apply  func(context.Context, *config.Policy) error
}

func (r *reapplier) Start(ctx context.Context) error {
	tick := time.NewTicker(reapplyEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			if e := r.source.Engine(); e != nil {
				_ = r.apply(ctx, e.Policy()) // logged and counted by each applier
			}
		}
	}
}

// watchCluster adds to mgr the policy ConfigMap's reconciler, the CEL
// backstop's apply and the background audit where asked for, and the caches
// reviews read namespace labels and ConfigMaps from.
func watchCluster(mgr manager.Manager, o Config, source *policysource.Source, m *Metrics) (reviewInputs, error) {
	reconciler := &policysource.Reconciler{
		Key: o.Policy.ConfigMap, Reader: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Source: source,
		Events: mgr.GetEventRecorder("gpuguard"), Reloads: m.PolicyReloads, MissingExemptNS: m.MissingExemptNS,
		Unguarded: o.Policy.UnguardedNamespaces, MissingUnguardedNS: m.MissingUnguardedNS, Log: o.Log.WithName("policy"),
		FallbackInForce: m.PolicyFallback,
	}
	if o.Policy.Fallback {
		reconciler.Fallback = config.DefaultYAML()
	}
	if o.Hardening.InjectVoid == InjectAuto {
		nodes := &hardening.Nodes{Reader: mgr.GetClient(), GPUNodeLabels: o.Hardening.GPUNodeLabels, LeaseNamespace: o.Hardening.EnforcerLeaseNamespace,
			IsGPUResource: func(r string) bool {
				if e := source.Engine(); e != nil {
					return e.Policy().Spec.IsGPUResource(r)
				}
				return config.Default().Spec.IsGPUResource(r)
			}}
		reconciler.Hardening = nodes
		reconciler.LeaseNamespace = o.Hardening.EnforcerLeaseNamespace
		reconciler.InjectionOff = m.InjectionOff
		if err := followDRASlices(mgr, o, nodes, reconciler); err != nil {
			return reviewInputs{}, err
		}
	}
	if apply := clusterAppliers(mgr, o, m); len(apply) > 0 {
		reconciler.Apply = func(ctx context.Context, p *config.Policy) error {
			var errs []error
			for _, a := range apply {
				errs = append(errs, a(ctx, p))
			}
			return errors.Join(errs...)
		}
		if err := mgr.Add(&reapplier{source: source, apply: reconciler.Apply}); err != nil {
			return reviewInputs{}, err
		}
	}
	registered, err := addRegistrar(mgr, o, source, reconciler.Apply)
	if err != nil {
		return reviewInputs{}, err
	}
	if err := reconciler.Setup(mgr); err != nil {
		return reviewInputs{}, err
	}
	if o.Audit.Interval > 0 {
		runner, err := backgroundaudit.New(mgr, source, o.Policy.ConfigMap.Namespace, o.Audit,
			backgroundaudit.Metrics{Runs: m.AuditRuns, Objects: m.AuditObjects, Duration: m.AuditDuration}, o.Log.WithName("audit"))
		if err != nil {
			return reviewInputs{}, err
		}
		if err := mgr.Add(runner); err != nil {
			return reviewInputs{}, err
		}
	}
	namespaces := lookup.NewNamespaces(mgr.GetCache(), mgr.GetAPIReader(), o.Lookups.APIReadTimeout)
	in := reviewInputs{namespaces: namespaces, ready: namespaces.Ready, registered: registered,
		configMaps: lookup.NewConfigMaps(mgr.GetAPIReader(), o.Lookups.ConfigMapCacheTTL, o.Lookups.APIReadTimeout, m.ConfigMapLookups),
		nodes:      lookup.NewNodes(mgr.GetAPIReader(), o.Lookups.APIReadTimeout)}
	return in, mgr.Add(namespaces)
}

// addRegistrar registers the webhook configurations once a replica is ready,
// where asked for, then applies what the webhook keeps on them (the
// pre-filter) without waiting for the next reapply.
func addRegistrar(mgr manager.Manager, o Config, source *policysource.Source, apply func(context.Context, *config.Policy) error) (healthz.Checker, error) {
	w := o.WebhookConfigurations
	if w.File == "" || !o.Role.applies() {
		return nil, nil
	}
	if _, err := registration.Load(w.File, w.Mutating, w.Validating); err != nil {
		return nil, err // refused at start, not after the first ready replica
	}
	clientset, err := kubernetes.NewForConfig(mgr.GetConfig())
	if err != nil {
		return nil, err
	}
	r := registration.NewRegistrar(registration.Registrar{File: w.File, MutatingConfig: w.Mutating, ValidatingConfig: w.Validating, Owner: w.Owner,
		Service: types.NamespacedName{Namespace: o.Policy.ConfigMap.Namespace, Name: o.Certificates.ServiceName},
		Client:  mgr.GetClient(), Reader: mgr.GetAPIReader(), Clientset: clientset, Log: o.Log.WithName("registration")})
	if apply != nil {
		r.Then = func(ctx context.Context) {
			if e := source.Engine(); e != nil {
				_ = apply(ctx, e.Policy()) // logged and counted by each applier
			}
		}
	}
	return r.Registered, mgr.Add(r)
}

// followDRASlices makes the hardened-cluster profile count the nodes on
// which a GPU DRA driver publishes ResourceSlices as GPU nodes, in the
// version of resource.k8s.io the API server serves. Where it serves none,
// no driver can publish a device either: it says so, and nodes are GPU
// nodes by their labels and capacity; where it serves only a version
// gpuguard does not read, it logs an error naming the versions.
// A failed discovery is an error: the webhook does not start on a guess.
func followDRASlices(mgr manager.Manager, o Config, nodes *hardening.Nodes, reconciler *policysource.Reconciler) error {
	if len(o.Hardening.GPUDRADrivers) == 0 {
		o.Log.Info("no GPU DRA driver configured: nodes with DRA GPUs only are not GPU nodes for the hardened-cluster profile")
		return nil
	}
	version, served, err := hardening.ServedSliceVersion(mgr.GetRESTMapper())
	if err != nil {
		return err
	}
	switch {
	case version == "" && len(served) == 0:
		o.Log.Info("the API server serves no ResourceSlices: no DRA driver can publish GPUs; GPU nodes are told by labels and capacity",
			"group", "resource.k8s.io")
		return nil
	case version == "":
		// An alpha version only (Kubernetes 1.31 with DRA turned on): a
		// node with DRA GPUs only goes unseen unless it carries a GPU label.
		o.Log.Error(nil, "ResourceSlices are served only in versions gpuguard does not read: a node with DRA GPUs only is not a GPU node unless it carries a GPU node label",
			"group", "resource.k8s.io", "served", served, "read", hardening.SliceVersions)
		return nil
	}
	o.Log.Info("GPU nodes include those with DRA devices of a GPU driver", "resourceSlices", "resource.k8s.io/"+version, "drivers", o.Hardening.GPUDRADrivers)
	nodes.SliceVersion, nodes.GPUDRADrivers = version, o.Hardening.GPUDRADrivers
	reconciler.DRASlice, reconciler.GPUDRADrivers = hardening.NewSlice(version), o.Hardening.GPUDRADrivers
	return nil
}
