package policysource

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/internal/wellknown"
	"github.com/gpuguard/gpuguard/webhook/hardening"
)

// Reconciler puts the policy ConfigMap in force whenever it changes. An edit
// that does not parse or validate, and a deleted ConfigMap, change nothing: the last
// good policy stays, and an Event on the ConfigMap says why. Before any policy
// was loaded, the Fallback stands in.
type Reconciler struct {
	Key       types.NamespacedName
	Reader    client.Reader // the manager's cache, restricted to this ConfigMap
	APIReader client.Reader
	Source    *Source
	Events    events.EventRecorder
	// Reloads counts a ConfigMap without the policy key as a failed load;
	// Unguarded are the namespaces the webhook configurations leave out;
	// MissingUnguardedNS counts those that do not exist, each also logged
	// and recorded as a Warning Event on the policy ConfigMap.
	Unguarded          []string
	MissingUnguardedNS prometheus.Gauge
	// missingUnguarded is what was last reported missing.
	missingUnguarded []string
	// MissingExemptNS is the number of exempt namespaces that do not exist.
	Reloads         *prometheus.CounterVec
	MissingExemptNS prometheus.Gauge
	Log             logr.Logger
	// Apply, when set, is called after every load that changes the policy,
	// and retried with backoff until it succeeds (the CEL backstop).
	Apply func(ctx context.Context, p *config.Policy) error
	// Fallback, when set, is the policy document put in force while the
	// ConfigMap has never held a valid policy (missing, without the key, or
	// invalid), so that a typo at install or a full restart does not leave
	// the webhook unready and, under failurePolicy Fail, every guarded
	// namespace without pods. FallbackInForce is 1 while it is in force.
	Fallback        []byte
	FallbackInForce prometheus.Gauge
	// Hardening, when set, is the hardened-cluster profile
	// (--inject-void=auto): the policy's void injection is off while it says
	// every GPU node refuses device requests in the environment. Nodes are
	// watched for it. InjectionOff is 1 while the injection is off.
	Hardening interface {
		AllHardened(ctx context.Context) (hardening.Verdict, error)
	}
	InjectionOff prometheus.Gauge
	// LeaseNamespace, when set, is where the node enforcers' Leases are,
	// which count for the profile too: they are watched, and the hardening
	// is read again when the first Lease it rests on would go stale (and at
	// least every leaseRecheck), since a Lease goes stale silently.
	LeaseNamespace string
	// DRASlice, when set, is an empty ResourceSlice of the served version:
	// the slices of GPUDRADrivers are watched, since a node on which one
	// publishes devices is a GPU node.
	DRASlice      client.Object
	GPUDRADrivers []string
	// Now is the clock; nil is time.Now.
	Now func() time.Time

	// hardenedUntil is when the hardening last read may change without an
	// event (hardening.Verdict.Until).
	hardenedUntil time.Time

	// applied is the hash of the policy Apply last succeeded with.
	applied string
	// lastSeen is the ConfigMap as last read: a deletion's Event names it, so
	// that each deletion is an Event of its own rather than a repeat of the last.
	lastSeen *corev1.ConfigMap
	// fallingBack: the policy in force is Fallback.
	fallingBack bool
}

// Setup adds the reconciler to the manager, watching the ConfigMap, and the
// Nodes' metadata when it follows their hardening.
func (r *Reconciler) Setup(mgr manager.Manager) error {
	b := ctrl.NewControllerManagedBy(mgr).Named("policy").For(&corev1.ConfigMap{})
	if r.Hardening != nil {
		toHardening := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
			return []reconcile.Request{{NamespacedName: hardeningKey}}
		})
		// Whole Nodes, not their metadata: a node advertising GPUs in its
		// allocatable is a GPU node, labelled or not.
		b = b.Watches(&corev1.Node{}, toHardening, builder.WithPredicates(nodeHardeningChanged()))
		if r.LeaseNamespace != "" {
			b = b.Watches(&coordinationv1.Lease{}, toHardening, builder.WithPredicates(leaseFreshnessChanged(r.now)))
		}
		if r.DRASlice != nil {
			b = b.Watches(r.DRASlice, toHardening, builder.WithPredicates(gpuSliceNodesChanged(r.GPUDRADrivers)))
		}
	}
	return b.Complete(r)
}

// leaseRecheck is how often, at least, the hardening is read again while
// Leases count: a third of the enforcers' Lease duration.
const leaseRecheck = 20 * time.Second

// staleMargin is how long after a Lease's expiry the hardening is read
// again, so that the read finds it stale.
const staleMargin = 50 * time.Millisecond

// hardeningKey is the request a Node change enqueues: the GPU nodes'
// hardening is read again, the ConfigMap is not.
var hardeningKey = types.NamespacedName{Name: "gpu-node-hardening"}

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	switch req.NamespacedName {
	case r.Key:
		if err := r.reconcileConfigMap(ctx); err != nil {
			return ctrl.Result{}, err
		}
	case hardeningKey:
	default:
		return ctrl.Result{}, nil
	}
	if err := r.followHardening(ctx); err != nil {
		return ctrl.Result{}, err
	}
	// A Lease goes stale without an event: look again when it would.
	again := r.recheck()
	if r.Source.Engine() == nil {
		return again, nil
	}
	if r.Apply != nil && r.applied != r.Source.Hash() {
		if err := r.Apply(ctx, r.Source.Engine().Policy()); err != nil {
			r.record(r.eventTarget(), corev1.EventTypeWarning, wellknown.ReasonBackstopFailed, "CEL backstop or pre-filter not updated: %s", truncate(err.Error(), 900))
			// Retried with backoff until it lands; the webhook enforces meanwhile.
			return ctrl.Result{}, err
		}
		r.applied = r.Source.Hash()
	}
	r.checkExemptNamespaces(ctx)
	return again, nil
}

// reconcileConfigMap reads the ConfigMap and puts its policy in force, or
// the fallback.
func (r *Reconciler) reconcileConfigMap(ctx context.Context) error {
	cm := &corev1.ConfigMap{}
	err := r.Reader.Get(ctx, r.Key, cm)
	switch {
	case apierrors.IsNotFound(err):
		cm = r.recordMissing(err) // Events name the ConfigMap as last seen
		r.fallBack(cm, "the policy ConfigMap does not exist")
	case err != nil:
		return err
	default:
		r.lastSeen = cm
		if problem := r.load(cm); problem != "" {
			r.fallBack(cm, problem)
		}
	}
	return nil
}

// eventTarget is the object Events about the policy in force go to: the
// ConfigMap as last seen, or a reference to it by name.
func (r *Reconciler) eventTarget() *corev1.ConfigMap {
	if r.lastSeen != nil {
		return r.lastSeen
	}
	return &corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Namespace: r.Key.Namespace, Name: r.Key.Name}}
}

// followHardening applies the hardened-cluster profile: the void injection
// is off while every GPU node reports itself hardened, and back on, with an
// Event, as soon as one does not (or when the nodes cannot be read).
func (r *Reconciler) followHardening(ctx context.Context) error {
	if r.Hardening == nil {
		return nil
	}
	v, err := r.Hardening.AllHardened(ctx)
	hardened, why := v.Hardened, v.Why
	if err != nil {
		why = err.Error()
	}
	r.hardenedUntil = v.Until
	changed, serr := r.Source.SetInjectionOff(hardened && err == nil)
	if r.InjectionOff != nil {
		r.InjectionOff.Set(boolGauge(r.Source.InjectionOff()))
	}
	if changed {
		state := "on"
		if r.Source.InjectionOff() {
			state = "off"
		}
		r.Log.Info("void injection "+state+" (hardened-cluster profile)", "why", why, "policyHash", r.Source.Hash())
		r.record(r.eventTarget(), corev1.EventTypeNormal, wellknown.ReasonInjectionProfile, "void injection %s: %s (policy %s in force)", state, why, r.Source.Hash())
	}
	return errors.Join(err, serr)
}

// recheck is when to read the hardening again without an event: when the
// first Lease the profile rests on would go stale, at most leaseRecheck
// away. Without Leases there is nothing that goes stale silently.
func (r *Reconciler) recheck() ctrl.Result {
	if r.LeaseNamespace == "" {
		return ctrl.Result{}
	}
	after := leaseRecheck
	if !r.hardenedUntil.IsZero() {
		after = min(after, max(r.hardenedUntil.Sub(r.now())+staleMargin, staleMargin))
	}
	return ctrl.Result{RequeueAfter: after}
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// load puts the ConfigMap's policy in force; when it cannot, it records why
// and returns it.
func (r *Reconciler) load(cm *corev1.ConfigMap) (problem string) {
	data, ok := cm.Data[config.ConfigMapKey]
	if !ok {
		r.Reloads.WithLabelValues("error").Inc()
		r.record(cm, corev1.EventTypeWarning, wellknown.ReasonPolicyInvalid, "resourceVersion %s has no key %q; the last good policy (hash %q) stays in force",
			cm.ResourceVersion, config.ConfigMapKey, r.Source.Hash())
		return fmt.Sprintf("resourceVersion %s has no key %q", cm.ResourceVersion, config.ConfigMapKey)
	}
	source := fmt.Sprintf("configmap %s key %s", r.Key, config.ConfigMapKey)
	changed, err := r.Source.Load(source, []byte(data))
	if err != nil {
		r.record(cm, corev1.EventTypeWarning, wellknown.ReasonPolicyInvalid, "resourceVersion %s not loaded, the last good policy (hash %q) stays in force: %s",
			cm.ResourceVersion, r.Source.Hash(), truncate(err.Error(), 800))
		return fmt.Sprintf("resourceVersion %s is not a valid policy", cm.ResourceVersion)
	}
	if r.fallingBack {
		r.fallingBack = false
		r.FallbackInForce.Set(0)
		r.Log.Info("the policy ConfigMap is valid: the built-in fallback policy is no longer in force", "configMap", r.Key)
	}
	if changed {
		r.record(cm, corev1.EventTypeNormal, wellknown.ReasonPolicyLoaded, "policy %s in force (resourceVersion %s)", r.Source.Hash(), cm.ResourceVersion)
	}
	return ""
}

// fallBack puts Fallback in force when no policy has ever been: loudly, with
// an error log line, a Warning Event on obj and the FallbackInForce gauge.
// Once any policy is in force, a bad edit keeps it instead.
func (r *Reconciler) fallBack(obj *corev1.ConfigMap, problem string) {
	if r.Fallback == nil || r.Source.Engine() != nil {
		return
	}
	if _, err := r.Source.Load("built-in default policy (fallback)", r.Fallback); err != nil {
		r.Log.Error(err, "the fallback policy does not load")
		return
	}
	r.fallingBack = true
	r.FallbackInForce.Set(1)
	r.Log.Error(errors.New(problem), "the policy ConfigMap has never held a valid policy: the built-in default policy is in force until it does",
		"configMap", r.Key, "policyHash", r.Source.Hash())
	r.record(obj, corev1.EventTypeWarning, wellknown.ReasonPolicyFallback,
		"%s and no policy was ever loaded from it: the built-in default policy (hash %q) is in force until it holds a valid one", problem, r.Source.Hash())
}

// checkExemptNamespaces logs and counts exempt namespaces that do not exist: where
// namespaces are self-service, a tenant could create one and be exempt.
func (r *Reconciler) checkExemptNamespaces(ctx context.Context) {
	e := r.Source.Engine()
	if e == nil {
		return
	}
	ex := e.Policy().Spec.Exemptions
	names := slices.Clone(ex.Namespaces)
	for _, sa := range ex.ServiceAccounts {
		names = append(names, sa.Namespace)
	}
	slices.Sort(names)
	missing := 0
	for _, name := range slices.Compact(names) {
		err := r.APIReader.Get(ctx, client.ObjectKey{Name: name}, &corev1.Namespace{})
		if apierrors.IsNotFound(err) {
			missing++
			r.Log.Info("exempt namespace does not exist; whoever creates it is exempt", "namespace", name)
		} else if err != nil {
			r.Log.Error(err, "could not check an exempt namespace", "namespace", name)
		}
	}
	r.MissingExemptNS.Set(float64(missing))
	r.checkUnguardedNamespaces(ctx)
}

// checkUnguardedNamespaces reports the namespaces the webhook
// configurations leave out that do not exist: whoever may create
// namespaces would get one gpuguard never sees. Reported when the set
// changes, not at every reconcile.
func (r *Reconciler) checkUnguardedNamespaces(ctx context.Context) {
	if r.MissingUnguardedNS == nil {
		return
	}
	var missing []string
	for _, name := range r.Unguarded {
		err := r.APIReader.Get(ctx, client.ObjectKey{Name: name}, &corev1.Namespace{})
		if apierrors.IsNotFound(err) {
			missing = append(missing, name)
		} else if err != nil {
			r.Log.Error(err, "could not check a namespace the webhooks leave out", "namespace", name)
		}
	}
	r.MissingUnguardedNS.Set(float64(len(missing)))
	if slices.Equal(missing, r.missingUnguarded) {
		return
	}
	r.missingUnguarded = missing
	if len(missing) > 0 {
		r.Log.Info("namespaces the webhooks leave out do not exist; whoever creates one gets a namespace gpuguard does not guard", "namespaces", missing)
		r.record(r.eventTarget(), corev1.EventTypeWarning, wellknown.ReasonUnguardedNamespaceMissing,
			"namespaces %v are left out of admission (admission.systemNamespaces) but do not exist: whoever may create namespaces could create one and be unguarded; remove them from the list or create them", missing)
	}
}

// recordMissing logs and records that the ConfigMap is gone. The Event is on
// the ConfigMap as last seen, with its UID, so that every deletion of a
// recreated ConfigMap is an Event of its own: the events library folds
// identical Events on one object into a series it reports only now and then.
func (r *Reconciler) recordMissing(err error) *corev1.ConfigMap {
	r.Log.Error(err, "policy ConfigMap not found; the last good policy stays in force", "configMap", r.Key, "policyHash", r.Source.Hash())
	gone := &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Namespace: r.Key.Namespace, Name: r.Key.Name},
	}
	if r.lastSeen == nil {
		r.record(gone, corev1.EventTypeWarning, wellknown.ReasonPolicyMissing,
			"policy ConfigMap not found; the last good policy (hash %q) stays in force", r.Source.Hash())
		return gone
	}
	gone.UID, gone.ResourceVersion = r.lastSeen.UID, r.lastSeen.ResourceVersion
	r.record(gone, corev1.EventTypeWarning, wellknown.ReasonPolicyMissing,
		"policy ConfigMap (uid %s, resourceVersion %s) deleted; the last good policy (hash %q) stays in force",
		gone.UID, gone.ResourceVersion, r.Source.Hash())
	r.lastSeen = nil
	return gone
}

func (r *Reconciler) record(cm *corev1.ConfigMap, eventType, reason, format string, args ...any) {
	if r.Events == nil {
		return
	}
	r.Events.Eventf(cm, nil, eventType, reason, "LoadPolicy", format, args...)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
