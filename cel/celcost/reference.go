package celcost

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Reference is a pod whose cost render-cel reports.
type Reference struct {
	// Name is a word; Description says what the pod holds.
	Name, Description string
	Pod               *corev1.Pod
}

// References are the pods render-cel reports the cost of: a typical one (an
// init container, a plain one and a GPU one, a few variables and mounts
// each) and a large one, far past what workloads carry, to show the
// headroom left under the budgets. Neither sets the device variable: the
// MutatingAdmissionPolicy has every container to inject.
func References() []Reference {
	return []Reference{
		{Name: "typical", Description: "an init container and 2 containers, one with a GPU, 5 variables and 2 mounts each",
			Pod: referencePod("typical", 1, 2, 5, 2)},
		{Name: "large", Description: "10 init containers and 40 containers, half with a GPU, 100 variables and 20 mounts each",
			Pod: referencePod("large", 10, 40, 100, 20)},
	}
}

// referencePod has inits init containers and containers containers, every
// other one with a GPU, each with vars variables and mounts volume mounts
// of as many volumes.
func referencePod(name string, inits, containers, vars, mounts int) *corev1.Pod {
	p := &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}, ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default",
		Annotations: map[string]string{"example.com/owner": "team-a"}, Labels: map[string]string{"app": name}}}
	for i := range mounts {
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: fmt.Sprintf("data-%d", i),
			VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "config"}}}})
	}
	container := func(kind string, i int) corev1.Container {
		c := corev1.Container{Name: fmt.Sprintf("%s-%d", kind, i), Image: "registry.example.com/app:1.0"}
		for v := range vars {
			c.Env = append(c.Env, corev1.EnvVar{Name: fmt.Sprintf("APP_SETTING_%d", v), Value: "value"})
		}
		for m := range mounts {
			c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: fmt.Sprintf("data-%d", m), MountPath: fmt.Sprintf("/data/%d", m), ReadOnly: true})
		}
		if i%2 == 1 {
			gpu := resource.MustParse("1")
			c.Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": gpu}
		}
		return c
	}
	for i := range inits {
		p.Spec.InitContainers = append(p.Spec.InitContainers, container("init", 2*i))
	}
	for i := range containers {
		p.Spec.Containers = append(p.Spec.Containers, container("main", i))
	}
	return p
}
