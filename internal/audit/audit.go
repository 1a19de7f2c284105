// Package audit judges what already exists in a cluster with a policy: the
// pods and pod controllers that admission never saw, because they came before
// gpuguard, during a webhook outage, or before a policy change. The gpuguard
// audit command and the webhook's background audit share it.
package audit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuguard/gpuguard/policy"
)

// DefaultExcluded are the namespaces left out besides the policy's own, as
// the chart leaves them out of its webhooks.
var DefaultExcluded = []string{"kube-system", "kube-node-lease"}

// Options say what to audit.
type Options struct {
	// Namespace to audit; "" for all.
	Namespace string
	// Excluded namespaces are not judged.
	Excluded []string
}

// Object is one existing object under audit.
type Object struct {
	Kind, APIVersion string
	Obj              runtime.Object
	Meta             metav1.Object
}

// Judged is an object and the engine's result for it.
type Judged struct {
	Object
	Result policy.Result
}

// Outcome is one audit: what was judged, and what was left out and why.
type Outcome struct {
	Judged  []Judged
	Skipped []string
}

// Run lists the objects of the chosen namespaces and judges each.
func Run(ctx context.Context, c kubernetes.Interface, e *policy.Engine, o Options) (Outcome, error) {
	objects, err := List(ctx, c, o.Namespace)
	if err != nil {
		return Outcome{}, err
	}
	labels, err := namespaceLabels(ctx, c)
	if err != nil {
		return Outcome{}, err
	}
	var out Outcome
	for _, w := range objects {
		ns := w.Meta.GetNamespace()
		if slices.Contains(o.Excluded, ns) {
			continue
		}
		if why := LeftOut(w); why != "" {
			out.Skipped = append(out.Skipped, fmt.Sprintf("%s %s/%s: %s", w.Kind, ns, w.Meta.GetName(), why))
			continue
		}
		r, err := Judge(ctx, e, w, labels[ns], ConfigMaps{c})
		if err != nil {
			return Outcome{}, fmt.Errorf("%s %s/%s: %w", w.Kind, ns, w.Meta.GetName(), err)
		}
		out.Judged = append(out.Judged, Judged{Object: w, Result: r})
	}
	return out, nil
}

// LeftOut says why an object is not judged, or "": a finished pod, and a
// ReplicaSet or Job that a Deployment or CronJob owns (its owner is judged).
func LeftOut(w Object) string {
	if p, ok := w.Obj.(*corev1.Pod); ok && (p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed) {
		return "finished (" + string(p.Status.Phase) + ")"
	}
	if owner := metav1.GetControllerOf(w.Meta); owner != nil && (owner.Kind == "Deployment" || owner.Kind == "CronJob") {
		return "owned by " + owner.Kind + " " + owner.Name + ", which is judged"
	}
	return ""
}

// Judge judges a stored object. A pod is judged as stored (the validating
// phase only): what it runs with is final, so a container left without void
// is a final-state violation, not a mutation to come. A controller is judged
// as at its creation, through its template.
func Judge(ctx context.Context, e *policy.Engine, w Object, nsLabels map[string]string, cms policy.ConfigMapSource) (policy.Result, error) {
	req := policy.Request{Operation: admissionv1.Create, Namespace: w.Meta.GetNamespace(), Object: w.Obj,
		NamespaceLabels: nsLabels, ConfigMaps: cms}
	if _, isPod := w.Obj.(*corev1.Pod); isPod {
		req.Phase = policy.Validating
		return e.Evaluate(ctx, &req), nil
	}
	return e.Admit(ctx, req)
}

// ConfigMaps serves envFrom inspection from the cluster.
type ConfigMaps struct{ Client kubernetes.Interface }

// ConfigMapData reads a ConfigMap's data.
func (l ConfigMaps) ConfigMapData(ctx context.Context, namespace, name string) (map[string]string, error) {
	cm, err := l.Client.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, policy.ErrConfigMapNotFound
	}
	if err != nil {
		return nil, err
	}
	return cm.Data, nil
}

func namespaceLabels(ctx context.Context, c kubernetes.Interface) (map[string]map[string]string, error) {
	list, err := c.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing namespaces: %w", err)
	}
	out := map[string]map[string]string{}
	for _, n := range list.Items {
		out[n.Name] = n.Labels
	}
	return out, nil
}

// List lists the pods and pod controllers of namespace ("" for all).
func List(ctx context.Context, c kubernetes.Interface, namespace string) ([]Object, error) {
	opts := metav1.ListOptions{}
	var out []Object
	var errs []error
	add := func(kind, apiVersion string, err error, objs []runtime.Object) {
		if err != nil {
			errs = append(errs, fmt.Errorf("listing %ss: %w", strings.ToLower(kind), err))
			return
		}
		for _, o := range objs {
			out = append(out, Object{Kind: kind, APIVersion: apiVersion, Obj: o, Meta: o.(metav1.Object)})
		}
	}
	pods, err := c.CoreV1().Pods(namespace).List(ctx, opts)
	add("Pod", "v1", err, items(pods, func(l *corev1.PodList) []corev1.Pod { return l.Items }))
	rcs, err := c.CoreV1().ReplicationControllers(namespace).List(ctx, opts)
	add("ReplicationController", "v1", err, items(rcs, func(l *corev1.ReplicationControllerList) []corev1.ReplicationController { return l.Items }))
	pts, err := c.CoreV1().PodTemplates(namespace).List(ctx, opts)
	add("PodTemplate", "v1", err, items(pts, func(l *corev1.PodTemplateList) []corev1.PodTemplate { return l.Items }))
	deps, err := c.AppsV1().Deployments(namespace).List(ctx, opts)
	add("Deployment", "apps/v1", err, items(deps, func(l *appsv1.DeploymentList) []appsv1.Deployment { return l.Items }))
	rss, err := c.AppsV1().ReplicaSets(namespace).List(ctx, opts)
	add("ReplicaSet", "apps/v1", err, items(rss, func(l *appsv1.ReplicaSetList) []appsv1.ReplicaSet { return l.Items }))
	sts, err := c.AppsV1().StatefulSets(namespace).List(ctx, opts)
	add("StatefulSet", "apps/v1", err, items(sts, func(l *appsv1.StatefulSetList) []appsv1.StatefulSet { return l.Items }))
	dss, err := c.AppsV1().DaemonSets(namespace).List(ctx, opts)
	add("DaemonSet", "apps/v1", err, items(dss, func(l *appsv1.DaemonSetList) []appsv1.DaemonSet { return l.Items }))
	jobs, err := c.BatchV1().Jobs(namespace).List(ctx, opts)
	add("Job", "batch/v1", err, items(jobs, func(l *batchv1.JobList) []batchv1.Job { return l.Items }))
	cjs, err := c.BatchV1().CronJobs(namespace).List(ctx, opts)
	add("CronJob", "batch/v1", err, items(cjs, func(l *batchv1.CronJobList) []batchv1.CronJob { return l.Items }))
	return out, errors.Join(errs...)
}

// items turns a typed list into objects; a nil list (its List failed) has none.
func items[L any, T any, PT interface {
	*T
	runtime.Object
}](list *L, of func(*L) []T) []runtime.Object {
	if list == nil {
		return nil
	}
	all := of(list)
	out := make([]runtime.Object, len(all))
	for i := range all {
		out[i] = PT(&all[i])
	}
	return out
}
