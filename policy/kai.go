package policy

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/policy/celexpr"
)

// KAI Scheduler's fractional GPUs (spec.integrations.kaiScheduler). KAI's pod
// admission gives the fraction container of a pod with a gpu-fraction or
// gpu-memory annotation NVIDIA_VISIBLE_DEVICES from a ConfigMap its binder
// fills in with the GPU's UUID before it binds the pod: configMapKeyRef
// PREFIX-INDEX (PREFIX-iINDEX for an init container), key
// NVIDIA_VISIBLE_DEVICES, not optional, where PREFIX is the pod's
// runai/shared-gpu-configmap annotation, which KAI generates ending in
// -shared-gpu. With the integration on, that one entry counts like void:
// inject-void and final-state accept it, env-value-from lets it through.
// Everything else stays as it was: a literal value, another ConfigMap, another
// key, an optional reference, a pod KAI does not schedule, or one created
// already bound to a node (KAI's binder, the ConfigMap's writer, never runs).
// The ConfigMap guard (cel.Render) lets only KAI's binder write ConfigMaps
// with such names.
const (
	KAIFractionAnnotation      = "gpu-fraction"
	KAIMemoryAnnotation        = "gpu-memory"
	KAIContainerNameAnnotation = "gpu-fraction-container-name"
	KAIConfigMapAnnotation     = "runai/shared-gpu-configmap"
	// KAIConfigMapSuffix ends every prefix KAI generates; the guard keys on it.
	KAIConfigMapSuffix = "-shared-gpu"
	// KAIConfigMapNamePattern matches the names of the ConfigMaps KAI's
	// binder writes for fraction containers: PREFIX-INDEX, PREFIX-iINDEX and
	// their -evar companions, which KAI pours into the container's env.
	KAIConfigMapNamePattern = `^.*-shared-gpu-i?[0-9]+(-evar)?$`
)

const visibleDevices = "NVIDIA_VISIBLE_DEVICES"

// KAIGPUGroupLabel is the label KAI's binder puts on a fraction pod, before
// it binds the pod, naming the GPU group of the GPU it shares; a pod whose
// fraction spans several GPUs gets KAIGPUGroupLabel/<group> for each
// instead. The binder runs one reservation pod for each group on the node,
// in its reservation namespace, with the same label: the kubelet allocates
// that pod the GPU, and the binder writes the fraction's ConfigMap with
// what the reservation pod reports of it (KAI-Scheduler
// pkg/binder/binding/resourcereservation).
const KAIGPUGroupLabel = "runai-gpu-group"

// KAIGPUGroups are the GPU groups KAI's binder bound pod to, from its
// labels, sorted; none for a pod it has not bound.
func KAIGPUGroups(pod *corev1.Pod) []string {
	var groups []string
	for key, value := range pod.Labels {
		if key == KAIGPUGroupLabel || strings.HasPrefix(key, KAIGPUGroupLabel+"/") {
			groups = append(groups, value)
		}
	}
	slices.Sort(groups)
	return slices.Compact(groups)
}

// KAIDevicesAnnotation is how many GPUs a fraction spans (default 1).
const KAIDevicesAnnotation = "gpu-fraction-num-devices"

// KAIFractionDevices is, for a pod as stored, how many GPUs KAI Scheduler
// gives container name as its fraction container: gpu-fraction-num-devices
// (else 1) when the pod asks for a fraction, KAI schedules it, and name is
// its fraction container; 0 otherwise. The node verifier accepts that many
// GPUs without a kubelet allocation.
func KAIFractionDevices(pod *corev1.Pod, name string, schedulers []string) int {
	if fc, ok := kaiFractionContainer(pod.Annotations, &pod.Spec, schedulers); !ok || fc != name {
		return 0
	}
	v, set := pod.Annotations[KAIDevicesAnnotation]
	n, err := strconv.Atoi(v)
	if !set || err != nil || n < 1 {
		return 1
	}
	return n
}

// kaiFractionContainer names the fraction container of a pod that asks for a
// fraction and that KAI schedules: gpu-fraction-container-name, else the
// first container; ok is false for any other pod.
func kaiFractionContainer(ann map[string]string, spec *corev1.PodSpec, schedulers []string) (string, bool) {
	_, fraction := ann[KAIFractionAnnotation]
	_, memory := ann[KAIMemoryAnnotation]
	if !(fraction || memory) || !slices.Contains(schedulers, spec.SchedulerName) || len(spec.Containers) == 0 {
		return "", false
	}
	if name, named := ann[KAIContainerNameAnnotation]; named {
		return name, true
	}
	return spec.Containers[0].Name, true
}

// kaiFractionRef reports whether env entry v of container c is the one KAI's
// admission gives c, with the integration on.
func (in *Input) kaiFractionRef(c *containerRef, v *corev1.EnvVar) bool {
	k := &in.e.policy.Spec.Integrations.KAIScheduler
	if !k.Fractions || v.Name != visibleDevices || v.ValueFrom == nil || v.ValueFrom.ConfigMapKeyRef == nil {
		return false
	}
	ref := v.ValueFrom.ConfigMapKeyRef
	if ref.Key != visibleDevices || (ref.Optional != nil && *ref.Optional) {
		return false
	}
	want, ok := kaiConfigMapName(in.t.meta.Annotations, in.t.spec, c, k.SchedulerNames)
	return ok && ref.Name == want
}

// kaiFraction reports whether container c, with the integration on, is a
// KAI fraction container that takes its device list from KAI's ConfigMap:
// it has no GPU limit, yet it gets a GPU, so the rules about what a GPU
// container may ask of the driver (protected variables, envFrom, driver
// capabilities) judge it as a GPU container.
func (in *Input) kaiFraction(c *containerRef) bool {
	if !in.e.policy.Spec.Integrations.KAIScheduler.Fractions {
		return false
	}
	v, ok := EffectiveEnv(c.c, visibleDevices)
	return ok && in.kaiFractionRef(c, &v)
}

// gpuFeatures: container c gets a GPU, through a GPU limit or as a KAI
// fraction container, and is judged by what a GPU container may ask for.
func (in *Input) gpuFeatures(c *containerRef) bool {
	return c.gpu || in.kaiFraction(c)
}

// kaiEnvVarConfigMap is the -evar ConfigMap KAI's admission pours into its
// fraction container c, which only KAI's binder may write (the guard); ""
// for any other container.
func (in *Input) kaiEnvVarConfigMap(c *containerRef) string {
	if !in.kaiFraction(c) {
		return ""
	}
	name, _ := kaiConfigMapName(in.t.meta.Annotations, in.t.spec, c, in.e.policy.Spec.Integrations.KAIScheduler.SchedulerNames)
	return name + "-evar"
}

// KAIFractionCEL is kaiFraction over a container c of a pod object:
// "false" with the integration off.
func KAIFractionCEL(p *config.Policy) string {
	if !p.Spec.Integrations.KAIScheduler.Fractions {
		return "false"
	}
	entries, last := celexpr.LastEntry(visibleDevices)
	return fmt.Sprintf(`(has(c.env) && size(%s) > 0 && %s)`, entries, KAIFractionRefCEL(p, last))
}

// kaiConfigMapName is the ConfigMap KAI's binder writes for container c; ok
// is false unless c is the fraction container of a pod KAI will bind.
func kaiConfigMapName(ann map[string]string, spec *corev1.PodSpec, c *containerRef, schedulers []string) (string, bool) {
	prefix := ann[KAIConfigMapAnnotation]
	name, ok := kaiFractionContainer(ann, spec, schedulers)
	switch {
	case !ok || c.c.Name != name || spec.NodeName != "" || !strings.HasSuffix(prefix, KAIConfigMapSuffix):
		return "", false
	case c.kind == initContainer:
		return prefix + "-i" + strconv.Itoa(c.index), true
	case c.kind == regularContainer:
		return prefix + "-" + strconv.Itoa(c.index), true
	}
	return "", false
}

// KAIFractionRefCEL is kaiFractionRef in CEL, over a pod object, its
// container c and an env entry e of it; "false" with the integration off.
func KAIFractionRefCEL(p *config.Policy, e string) string {
	k := &p.Spec.Integrations.KAIScheduler
	if !k.Fractions {
		return "false"
	}
	ann := "object.metadata.annotations"
	prefix := ann + "[" + celexpr.Str(KAIConfigMapAnnotation) + "]"
	ref := e + ".valueFrom.configMapKeyRef"
	index := func(list, sep string) string {
		return fmt.Sprintf(`(has(object.spec.%[1]s) && object.spec.%[1]s.exists(x, x.name == c.name) && %[2]s.name == %[3]s + %[4]s + string(object.spec.%[1]s.map(x, x.name).indexOf(c.name)))`,
			list, ref, prefix, celexpr.Str(sep))
	}
	return fmt.Sprintf(`(has(%[1]s) && (%[2]s in %[1]s || %[3]s in %[1]s) && has(object.spec.schedulerName) && object.spec.schedulerName in %[4]s && `+
		`!(has(object.spec.nodeName) && object.spec.nodeName != "") && %[5]s in %[1]s && %[6]s.endsWith(%[7]s) && `+
		`c.name == (%[8]s in %[1]s ? %[1]s[%[8]s] : object.spec.containers[0].name) && `+
		`%[9]s.name == %[10]s && has(%[9]s.valueFrom) && has(%[11]s) && %[11]s.key == %[10]s && !(has(%[11]s.optional) && %[11]s.optional) && (%[12]s || %[13]s))`,
		ann, celexpr.Str(KAIFractionAnnotation), celexpr.Str(KAIMemoryAnnotation), celexpr.List(k.SchedulerNames),
		celexpr.Str(KAIConfigMapAnnotation), prefix, celexpr.Str(KAIConfigMapSuffix), celexpr.Str(KAIContainerNameAnnotation),
		e, celexpr.Str(visibleDevices), ref, index("containers", "-"), index("initContainers", "-i"))
}

// EffectivelyVoidCEL is, over a pod's container c, that the variable's last
// entry is a literal void or "", or KAI's fraction entry where the policy
// accepts it.
func EffectivelyVoidCEL(p *config.Policy, name string) string {
	void := celexpr.EffectivelyVoid(name)
	if name != visibleDevices || !p.Spec.Integrations.KAIScheduler.Fractions {
		return void
	}
	entries, last := celexpr.LastEntry(name)
	return fmt.Sprintf(`(%s || (has(c.env) && size(%s) > 0 && %s))`, void, entries, KAIFractionRefCEL(p, last))
}
