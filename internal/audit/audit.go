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
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/pager"

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
	labels, err := namespaceLabels(ctx, c)
	if err != nil {
		return Outcome{}, err
	}
	var out Outcome
	err = Each(ctx, c, o.Namespace, func(w Object) error {
		ns := w.Meta.GetNamespace()
		if slices.Contains(o.Excluded, ns) {
			return nil
		}
		if why := LeftOut(w); why != "" {
			out.Skipped = append(out.Skipped, fmt.Sprintf("%s %s/%s: %s", w.Kind, ns, w.Meta.GetName(), why))
			return nil
		}
		r, err := Judge(ctx, e, w, labels[ns], ConfigMaps{c})
		if err != nil {
			return fmt.Errorf("%s %s/%s: %w", w.Kind, ns, w.Meta.GetName(), err)
		}
		// Only the object's identity is kept, not the object: the page it
		// came in can go.
		w.Obj, w.Meta = nil, &metav1.ObjectMeta{Name: w.Meta.GetName(), Namespace: ns, UID: w.Meta.GetUID()}
		out.Judged = append(out.Judged, Judged{Object: w, Result: r})
		return nil
	})
	return out, err
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

// pageSize bounds what one list call holds in memory: the audit runs inside
// the webhook, whose memory limit is small, on clusters of any size.
const pageSize = 500

// lister is one kind's paged list.
type lister struct {
	kind, apiVersion string
	list             func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error)
}

func listers(c kubernetes.Interface, ns string) []lister {
	return []lister{
		{"Pod", "v1", func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return c.CoreV1().Pods(ns).List(ctx, o)
		}},
		{"ReplicationController", "v1", func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return c.CoreV1().ReplicationControllers(ns).List(ctx, o)
		}},
		{"PodTemplate", "v1", func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return c.CoreV1().PodTemplates(ns).List(ctx, o)
		}},
		{"Deployment", "apps/v1", func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return c.AppsV1().Deployments(ns).List(ctx, o)
		}},
		{"ReplicaSet", "apps/v1", func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return c.AppsV1().ReplicaSets(ns).List(ctx, o)
		}},
		{"StatefulSet", "apps/v1", func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return c.AppsV1().StatefulSets(ns).List(ctx, o)
		}},
		{"DaemonSet", "apps/v1", func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return c.AppsV1().DaemonSets(ns).List(ctx, o)
		}},
		{"Job", "batch/v1", func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return c.BatchV1().Jobs(ns).List(ctx, o)
		}},
		{"CronJob", "batch/v1", func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return c.BatchV1().CronJobs(ns).List(ctx, o)
		}},
	}
}

// Each hands every pod and pod controller of namespace ("" for all) to fn,
// one page of each kind at a time.
func Each(ctx context.Context, c kubernetes.Interface, namespace string, fn func(Object) error) error {
	var errs []error
	for _, l := range listers(c, namespace) {
		p := pager.New(pager.SimplePageFunc(func(opts metav1.ListOptions) (runtime.Object, error) { return l.list(ctx, opts) }))
		p.PageSize = pageSize
		err := p.EachListItem(ctx, metav1.ListOptions{}, func(obj runtime.Object) error {
			return fn(Object{Kind: l.kind, APIVersion: l.apiVersion, Obj: obj, Meta: obj.(metav1.Object)})
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("listing %ss: %w", strings.ToLower(l.kind), err))
		}
	}
	return errors.Join(errs...)
}
