package webhook

import (
	"context"
	"fmt"
	"slices"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/gpuguard/gpuguard/config"
)

// Event reasons recorded on the policy ConfigMap.
const (
	ReasonPolicyLoaded   = "PolicyLoaded"
	ReasonPolicyInvalid  = "PolicyInvalid"
	ReasonPolicyMissing  = "PolicyMissing"
	ReasonBackstopFailed = "BackstopFailed"
)

// policyReconciler puts the policy ConfigMap in force whenever it changes. An edit
// that does not parse or validate, and a deleted ConfigMap, change nothing: the last
// good policy stays, and an Event on the ConfigMap says why.
type policyReconciler struct {
	key       types.NamespacedName
	reader    client.Reader // the manager's cache, restricted to this ConfigMap
	apiReader client.Reader
	source    *PolicySource
	events    events.EventRecorder
	metrics   *Metrics
	log       logr.Logger
	// backstop, when set, is re-applied after every load that changes the policy.
	backstop *backstopSync
	// lastSeen is the ConfigMap as last read: a deletion's Event names it, so
	// that each deletion is an Event of its own rather than a repeat of the last.
	lastSeen *corev1.ConfigMap
}

func (r *policyReconciler) setup(mgr manager.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).Named("policy").For(&corev1.ConfigMap{}).Complete(r)
}

// Reconcile implements reconcile.Reconciler.
func (r *policyReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if req.NamespacedName != r.key {
		return ctrl.Result{}, nil
	}
	cm := &corev1.ConfigMap{}
	err := r.reader.Get(ctx, r.key, cm)
	switch {
	case apierrors.IsNotFound(err):
		r.recordMissing(err)
		return ctrl.Result{}, nil
	case err != nil:
		return ctrl.Result{}, err
	}
	r.lastSeen = cm
	data, ok := cm.Data[config.ConfigMapKey]
	if !ok {
		r.metrics.PolicyReloads.WithLabelValues("error").Inc()
		r.record(cm, corev1.EventTypeWarning, ReasonPolicyInvalid, "resourceVersion %s has no key %q; the last good policy (hash %q) stays in force",
			cm.ResourceVersion, config.ConfigMapKey, r.source.Hash())
		return ctrl.Result{}, nil
	}
	source := fmt.Sprintf("configmap %s key %s", r.key, config.ConfigMapKey)
	changed, err := r.source.Load(source, []byte(data))
	if err != nil {
		r.record(cm, corev1.EventTypeWarning, ReasonPolicyInvalid, "resourceVersion %s not loaded, the last good policy (hash %q) stays in force: %s",
			cm.ResourceVersion, r.source.Hash(), truncate(err.Error(), 800))
		return ctrl.Result{}, nil
	}
	if changed {
		r.record(cm, corev1.EventTypeNormal, ReasonPolicyLoaded, "policy %s in force (resourceVersion %s)", r.source.Hash(), cm.ResourceVersion)
	}
	if r.backstop != nil && r.backstop.applied != r.source.Hash() {
		if err := r.backstop.apply(ctx, r.source.Engine().Policy()); err != nil {
			r.record(cm, corev1.EventTypeWarning, ReasonBackstopFailed, "CEL backstop not updated: %s", truncate(err.Error(), 900))
			// Retried with backoff until it lands; the webhook enforces meanwhile.
			return ctrl.Result{}, err
		}
		r.backstop.applied = r.source.Hash()
	}
	r.checkExemptNamespaces(ctx)
	return ctrl.Result{}, nil
}

// checkExemptNamespaces logs and counts exempt namespaces that do not exist: where
// namespaces are self-service, a tenant could create one and be exempt.
func (r *policyReconciler) checkExemptNamespaces(ctx context.Context) {
	e := r.source.Engine()
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
		err := r.apiReader.Get(ctx, client.ObjectKey{Name: name}, &corev1.Namespace{})
		if apierrors.IsNotFound(err) {
			missing++
			r.log.Info("exempt namespace does not exist; whoever creates it is exempt", "namespace", name)
		} else if err != nil {
			r.log.Error(err, "could not check an exempt namespace", "namespace", name)
		}
	}
	r.metrics.MissingExemptNS.Set(float64(missing))
}

// recordMissing logs and records that the ConfigMap is gone. The Event is on
// the ConfigMap as last seen, with its UID, so that every deletion of a
// recreated ConfigMap is an Event of its own: the events library folds
// identical Events on one object into a series it reports only now and then.
func (r *policyReconciler) recordMissing(err error) {
	r.log.Error(err, "policy ConfigMap not found; the last good policy stays in force", "configMap", r.key, "policyHash", r.source.Hash())
	gone := &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Namespace: r.key.Namespace, Name: r.key.Name},
	}
	if r.lastSeen == nil {
		r.record(gone, corev1.EventTypeWarning, ReasonPolicyMissing,
			"policy ConfigMap not found; the last good policy (hash %q) stays in force", r.source.Hash())
		return
	}
	gone.UID, gone.ResourceVersion = r.lastSeen.UID, r.lastSeen.ResourceVersion
	r.record(gone, corev1.EventTypeWarning, ReasonPolicyMissing,
		"policy ConfigMap (uid %s, resourceVersion %s) deleted; the last good policy (hash %q) stays in force",
		gone.UID, gone.ResourceVersion, r.source.Hash())
	r.lastSeen = nil
}

func (r *policyReconciler) record(cm *corev1.ConfigMap, eventType, reason, format string, args ...any) {
	if r.events == nil {
		return
	}
	r.events.Eventf(cm, nil, eventType, reason, "LoadPolicy", format, args...)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
