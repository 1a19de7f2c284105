package policy

import (
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// target is the pod, or the pod template of a controller, that a request is about.
type target struct {
	// object is the metadata of the object itself (the controller, for a template).
	object *metav1.ObjectMeta
	// meta and spec are the pod's, or the template's.
	meta     *metav1.ObjectMeta
	spec     *corev1.PodSpec
	metaPath *field.Path
	specPath *field.Path
	// isPod is true for a Pod: only pods are patched; templates are judged only.
	isPod bool
	// isBinding is true for a Binding (pods/binding), whose annotations the API
	// server copies onto the pod it binds. Its spec is empty.
	isBinding bool
}

// targetOf finds the pod or pod template in an object; ok is false for other kinds.
func targetOf(obj runtime.Object) (t target, ok bool) {
	tmpl := func(om *metav1.ObjectMeta, pt *corev1.PodTemplateSpec, at *field.Path) (target, bool) {
		return target{object: om, meta: &pt.ObjectMeta, spec: &pt.Spec,
			metaPath: at.Child("metadata"), specPath: at.Child("spec")}, true
	}
	spec := field.NewPath("spec")
	switch o := obj.(type) {
	case *corev1.Pod:
		return target{object: &o.ObjectMeta, meta: &o.ObjectMeta, spec: &o.Spec,
			metaPath: field.NewPath("metadata"), specPath: spec, isPod: true}, true
	case *corev1.Binding:
		return target{object: &o.ObjectMeta, meta: &o.ObjectMeta, spec: &corev1.PodSpec{},
			metaPath: field.NewPath("metadata"), specPath: spec, isBinding: true}, true
	case *corev1.PodTemplate:
		return tmpl(&o.ObjectMeta, &o.Template, field.NewPath("template"))
	case *corev1.ReplicationController:
		if o.Spec.Template == nil {
			return target{}, false
		}
		return tmpl(&o.ObjectMeta, o.Spec.Template, spec.Child("template"))
	case *appsv1.Deployment:
		return tmpl(&o.ObjectMeta, &o.Spec.Template, spec.Child("template"))
	case *appsv1.ReplicaSet:
		return tmpl(&o.ObjectMeta, &o.Spec.Template, spec.Child("template"))
	case *appsv1.StatefulSet:
		return tmpl(&o.ObjectMeta, &o.Spec.Template, spec.Child("template"))
	case *appsv1.DaemonSet:
		return tmpl(&o.ObjectMeta, &o.Spec.Template, spec.Child("template"))
	case *batchv1.Job:
		return tmpl(&o.ObjectMeta, &o.Spec.Template, spec.Child("template"))
	case *batchv1.CronJob:
		return tmpl(&o.ObjectMeta, &o.Spec.JobTemplate.Spec.Template, spec.Child("jobTemplate", "spec", "template"))
	}
	return target{}, false
}

// Supported reports whether the engine evaluates objects of this type: pods, the
// pod controllers whose templates it judges, and pod bindings.
func Supported(obj runtime.Object) bool {
	_, ok := targetOf(obj)
	return ok
}
