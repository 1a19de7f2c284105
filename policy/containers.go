package policy

import (
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// containerKind is where a container sits in a pod spec.
type containerKind int

const (
	initContainer containerKind = iota
	regularContainer
	ephemeralContainer
)

var kindFields = [...]string{"initContainers", "containers", "ephemeralContainers"}

// containerRef is one container under evaluation. Every container kind counts on its
// own: init containers, sidecars, regular and ephemeral containers.
type containerRef struct {
	kind  containerKind
	index int
	pos   int // position in the evaluation's container list
	c     *corev1.Container
	gpu   bool
	spec  *field.Path // the pod spec's path, for field paths on demand
}

// path is the container's field path, built only when a finding needs it.
func (r *containerRef) path() *field.Path {
	return r.spec.Child(kindFields[r.kind]).Index(r.index)
}

// pointer is the container's JSON pointer in a Pod, for patches.
func (r *containerRef) pointer() string {
	return "/spec/" + kindFields[r.kind] + "/" + strconv.Itoa(r.index)
}

// containersOf lists every container of a pod spec.
func (e *Engine) containersOf(spec *corev1.PodSpec, specPath *field.Path) []containerRef {
	refs := make([]containerRef, 0, len(spec.InitContainers)+len(spec.Containers)+len(spec.EphemeralContainers))
	for i := range spec.InitContainers {
		refs = append(refs, e.ref(initContainer, i, &spec.InitContainers[i], specPath))
	}
	for i := range spec.Containers {
		refs = append(refs, e.ref(regularContainer, i, &spec.Containers[i], specPath))
	}
	for i := range spec.EphemeralContainers {
		// EphemeralContainerCommon has the fields of Container, in the same order.
		c := (*corev1.Container)(&spec.EphemeralContainers[i].EphemeralContainerCommon)
		refs = append(refs, e.ref(ephemeralContainer, i, c, specPath))
	}
	for i := range refs {
		refs[i].pos = i
	}
	return refs
}

// newEphemeralContainers lists the ephemeral containers whose names are not in old.
func (e *Engine) newEphemeralContainers(spec *corev1.PodSpec, specPath *field.Path, old map[string]bool) []containerRef {
	var refs []containerRef
	for i := range spec.EphemeralContainers {
		ec := &spec.EphemeralContainers[i]
		if !old[ec.Name] {
			refs = append(refs, e.ref(ephemeralContainer, i, (*corev1.Container)(&ec.EphemeralContainerCommon), specPath))
			refs[len(refs)-1].pos = len(refs) - 1
		}
	}
	return refs
}

func (e *Engine) ref(kind containerKind, i int, c *corev1.Container, specPath *field.Path) containerRef {
	return containerRef{kind: kind, index: i, c: c, gpu: e.isGPUContainer(c), spec: specPath}
}

// isGPUContainer: the container's limits hold a GPU resource with a quantity above
// zero. A zero limit, a request without a limit, or a DRA claim does not count.
func (e *Engine) isGPUContainer(c *corev1.Container) bool {
	for name, q := range c.Resources.Limits {
		if q.Sign() > 0 && e.isGPUResource(string(name)) {
			return true
		}
	}
	return false
}

// EffectiveEnv is the entry of a variable that a container's process gets:
// of several, the last one, as the kubelet builds the environment; ok is
// false when the container does not set it. An entry set through valueFrom
// has no literal value: check its ValueFrom.
func EffectiveEnv(c *corev1.Container, name string) (v corev1.EnvVar, ok bool) {
	for i := len(c.Env) - 1; i >= 0; i-- {
		if c.Env[i].Name == name {
			return c.Env[i], true
		}
	}
	return corev1.EnvVar{}, false
}
