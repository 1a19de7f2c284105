// Package enforcer is the node enforcer: an NRI plugin that holds one
// invariant when the runtime creates a container, whatever admission saw or
// missed: the container's final spec grants exactly the GPUs the kubelet
// allocated to it, through every channel the NVIDIA runtime honours. Admission
// sees the pod; this package sees the container the runtime is about to run,
// image ENV and Secrets poured in by envFrom included.
//
// Decide is pure: it turns what the runtime shows of one container and what
// the kubelet allocated into the adjustment. plugin.go wires it to NRI.
package enforcer

import (
	"fmt"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/gpuguard/gpuguard/agent/discovery"
	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/policy"
)

// Void is the device list that grants nothing, and no driver either.
const Void = "void"

// cudaVersionEnv: with it set and NVIDIA_VISIBLE_DEVICES unset, the toolkit
// treats an image as legacy and grants every GPU.
const cudaVersionEnv = "CUDA_VERSION"

// Container is what the runtime shows of one container being created.
type Container struct {
	// Name is the container's name in its pod.
	Name string
	// PodAnnotations are its pod's annotations, which NRI plugins read
	// (NVIDIA's CDI injector among them) and none can remove.
	PodAnnotations map[string]string
	// Env is the final environment, KEY=VALUE, image ENV included.
	Env []string
	// Mounts are the container paths of its mounts and their sources.
	Mounts []Mount
	// Annotations are the OCI annotations the runtime passes on.
	Annotations map[string]string
	// Devices are the device nodes in its spec.
	Devices []Device
	// DeviceRules are its device cgroup's rules (linux.resources.devices).
	DeviceRules []DeviceRule
	// AllDevices: its device cgroup allows every device, as for a
	// privileged container.
	AllDevices bool
}

// Mount is one mount of a container.
type Mount struct{ Destination, Source string }

// Facts are what the enforcer knows of the container beyond its spec.
type Facts struct {
	// Allocated are the device IDs the kubelet allocated to the container
	// for GPU resources, as PodResources reports them.
	Allocated []string
	// Claimed are the devices of the container's DRA claims of NVIDIA's
	// drivers, as PodResources reports them; ClaimedCDI the CDI devices
	// the kubelet hands the runtime for them, whose specs the DRA driver
	// writes. Both count as grants, as the allocation does.
	Claimed    []ClaimedDevice
	ClaimedCDI []string
	// Exempt names the exemption that covers the pod; "" for none.
	Exempt string
	// Waived are the rules the exemption waives; nil for every rule.
	Waived policy.RuleSet
	// KAIFraction: the fraction container of a pod KAI scheduled, with the
	// integration on: KAI, not the kubelet, accounts for its GPUs.
	KAIFraction bool
	// KAIBound are, for a KAI fraction container, the device IDs the
	// kubelet allocated to the reservation pods of its pod's GPU groups on
	// this node: the GPUs KAI bound the fraction to, which its device list
	// may name. KAIUnbound, when set, says why they cannot be told, and the
	// fraction container is refused.
	KAIBound   []string
	KAIUnbound string
}

// ClaimedDevice is one device of a DRA claim: its driver's name and the
// device's name in the driver's pool ("gpu-0" of gpu.nvidia.com).
type ClaimedDevice struct{ Driver, Device string }

// granted reports whether the kubelet gave the container devices, through
// a device plugin or a DRA claim.
func (f Facts) granted() bool { return len(f.Allocated) > 0 || len(f.Claimed) > 0 }

// Decision is the adjustment of one container.
type Decision struct {
	// Refuse, when set, is why the container must not be created.
	Refuse string
	// SetEnv are variables set (replacing any value).
	SetEnv map[string]string
	// RemoveMounts and RemoveAnnotations are taken away: mount
	// destinations and annotation keys. There is no RemoveEnv nor
	// RemoveDevices: NRI does not pass on the removal of a variable or a
	// device node the container already has. SetEnv sets a variable to a
	// value that grants nothing; a device beyond the allocation gets the
	// container refused.
	RemoveMounts, RemoveAnnotations []string
	// InjectCDI are CDI devices added: the enforcer's void device and the
	// allocated devices, where a device variable set more than once cannot
	// be narrowed through the environment (see cdi.go).
	InjectCDI []string
	// Changes say, one line each, what was changed and why.
	Changes []string
}

// Changed reports whether the decision changes the container.
func (d Decision) Changed() bool { return d.Refuse != "" || len(d.Changes) > 0 }

// Rules are the policy and node facts the decision follows.
type Rules struct {
	policy *config.PolicySpec
	engine *policy.Engine
	// deviceListRoots are the container paths under which the toolkit reads
	// /dev/null mounts as device requests.
	deviceListRoots []string
	// cdiPrefixes are the annotation prefixes the toolkit reads CDI device
	// requests from.
	cdiPrefixes []string
	// podCDIKeys are the pod annotation keys NRI plugins read CDI device
	// requests from: NVIDIA's injector reads KEY/container.<name>, then
	// KEY/pod, then KEY.
	podCDIKeys []string
	gpus       *Inventory
	// cdi names devices through the node's CDI specs; nil where the
	// enforcer has none, and a variable set twice is then refused.
	cdi CDINamer
	// inject resolves the CDI devices plugins ask for, to judge the final
	// spec at validation; nil where the enforcer reads no CDI spec, and a
	// CDI device in an adjustment is then rejected.
	inject CDIInjector
	// majors are the node's NVIDIA character device majors.
	majors DeviceMajors
}

// NeedsAllocation reports whether what the kubelet allocated could matter
// to c: false for a container the decision leaves alone even with nothing
// allocated, which grants nothing whatever was allocated (an allocation only
// widens what is covered). It reads no CDI spec: a variable set twice is a
// change whether it is narrowed or refused.
func (r *Rules) NeedsAllocation(c Container) bool {
	plain := *r
	plain.cdi, plain.inject = nil, nil
	return plain.Decide(c, Facts{}).Changed()
}

// WithCDI lets r narrow a variable set more than once through CDI.
func (r *Rules) WithCDI(n CDINamer) *Rules {
	r.cdi = n
	if inj, ok := n.(CDIInjector); ok {
		r.inject = inj
	}
	return r
}

// WithDeviceMajors judges device nodes and cgroup rules by the node's
// NVIDIA majors, read once from its /proc/devices (ReadDeviceMajors).
func (r *Rules) WithDeviceMajors(m DeviceMajors) *Rules {
	if m != nil {
		r.majors = m
	}
	return r
}

// NewRules builds the rules of a policy on a node with inv's GPUs.
func NewRules(p *config.Policy, inv *discovery.Inventory) (*Rules, error) {
	e, err := policy.New(p)
	if err != nil {
		return nil, err
	}
	return &Rules{policy: &p.Spec, engine: e, deviceListRoots: p.Spec.DeviceListMountRoots,
		cdiPrefixes: []string{"cdi.k8s.io/"}, podCDIKeys: []string{NVIDIACDIAnnotation}, gpus: NewInventory(inv), majors: DefaultDeviceMajors()}, nil
}

// Decide makes c grant exactly what f says the kubelet allocated.
func (r *Rules) Decide(c Container, f Facts) Decision {
	d := Decision{SetEnv: map[string]string{}}
	if f.Exempt != "" && f.Waived == nil {
		return d
	}
	if c.AllDevices && !f.Waived[policy.RulePrivileged] {
		d.Refuse = "gpuguard: a privileged container sees every GPU of the node whatever the kubelet allocated; drop privileged or exempt its service account"
		return d
	}
	grant := r.gpus.grant(slices.Concat(f.Allocated, f.KAIBound))
	grant.claim(r.gpus, f.Claimed, f.ClaimedCDI)
	env, counts := envMap(c.Env)
	gpu := f.granted() || f.KAIFraction
	// Each channel follows the rule that guards it at admission: an
	// exemption waiving that rule leaves the channel as the pod set it.
	gpuRule := policy.RuleInjectVoid
	if f.granted() {
		gpuRule = policy.RuleDeviceEnv
	}
	keepGPUs := f.Waived[gpuRule]
	if f.KAIFraction && !keepGPUs && len(f.KAIBound) == 0 {
		why := f.KAIUnbound
		if why == "" {
			why = "no reservation pod of its GPU group was found"
		}
		d.Refuse = "gpuguard: the container is a KAI Scheduler fraction, and the GPU KAI bound it to cannot be told: " + why +
			"; its device list is not trusted without it: the container is created again once KAI's reservation pod runs"
		return d
	}
	if !keepGPUs {
		if refuse := r.decideKAIList(env, grant, f.KAIFraction); refuse != "" {
			return Decision{Refuse: refuse}
		}
		r.decideDeviceVariables(&d, env, grant)
	}
	if !f.Waived[policy.RuleProtectedEnv] {
		if refuse := r.decideProtected(&d, env, gpu); refuse != "" {
			return Decision{Refuse: refuse}
		}
	}
	if refuse := r.decideRepeated(&d, env, counts, grant); refuse != "" {
		return Decision{Refuse: refuse}
	}
	if !f.Waived[policy.RuleDeviceListMount] {
		r.decideMounts(&d, c.Mounts, grant)
	}
	if !f.Waived[policy.RuleDeviceAnnotation] {
		r.decideAnnotations(&d, c.Annotations, grant)
		if refuse := r.decidePodAnnotations(c, grant); refuse != "" {
			return Decision{Refuse: refuse}
		}
	}
	if refuse := r.decideDevices(c, deviceLimits{g: grant, gpu: gpu, keep: keepGPUs}); refuse != "" {
		return Decision{Refuse: refuse}
	}
	return d
}

// inertValues are, for each protected variable gpuguard knows, the value
// with which the NVIDIA Container Toolkit grants nothing through it. NRI
// cannot remove a variable the container already has (docs/agent.md,
// "What NRI passes on"): the enforcer sets it to this value instead, and
// refuses a container with a protected variable it knows no such value of.
//
//   - NVIDIA_DRIVER_CAPABILITIES: the toolkit's default, what an empty value
//     gives; unset would give every capability to a legacy CUDA image.
//   - NVIDIA_MIG_CONFIG_DEVICES, NVIDIA_MIG_MONITOR_DEVICES: empty; the hook
//     passes a non-empty value on (and refuses one in an unprivileged
//     container), an empty one as unset.
//   - NVIDIA_IMEX_CHANNELS: void, read as the device lists are.
//   - NVIDIA_GDS, NVIDIA_MOFED, NVIDIA_NVSWITCH, NVIDIA_GDRCOPY: disabled,
//     which turns the feature off even where the toolkit's config turns it on.
//   - NVIDIA_REQUIRE_JETPACK: empty; only csv-mounts=all widens the mounts,
//     and the variable is left out of the requirements checked.
var inertValues = map[string]string{
	"NVIDIA_DRIVER_CAPABILITIES": "utility,compute",
	"NVIDIA_MIG_CONFIG_DEVICES":  "",
	"NVIDIA_MIG_MONITOR_DEVICES": "",
	"NVIDIA_IMEX_CHANNELS":       Void,
	"NVIDIA_GDS":                 "disabled",
	"NVIDIA_MOFED":               "disabled",
	"NVIDIA_NVSWITCH":            "disabled",
	"NVIDIA_GDRCOPY":             "disabled",
	"NVIDIA_REQUIRE_JETPACK":     "",
}

// decideProtected sets the protected variables the policy does not allow
// the container to their inert values; device variables are
// decideDeviceVariables' to set. A protected variable without a known inert
// value gets the container refused, naming it.
func (r *Rules) decideProtected(d *Decision, env map[string]string, gpu bool) (refuse string) {
	for _, name := range slices.Sorted(maps.Keys(env)) {
		problem := r.engine.ProtectedEnvProblem(gpu, name, env[name])
		if problem == "" || slices.Contains(r.policy.DeviceVariables(), name) {
			continue
		}
		inert, known := inertValues[name]
		switch {
		case !known:
			return fmt.Sprintf("gpuguard: the container %s, and NRI cannot remove a variable the container already has; gpuguard knows no value of %s that grants nothing: remove it from the image or the pod",
				problem, name)
		case env[name] == inert:
			continue
		}
		d.SetEnv[name] = inert
		d.Changes = append(d.Changes, fmt.Sprintf("set %s=%s (was %q): %s", name, inert, env[name], problem))
	}
	return ""
}

// decideRepeated handles variables to change that occur more than once.
// The runtime reads a variable's last occurrence, and NRI changes only its
// first (containerd keeps the image's, the device
// plugin's and the pod's values side by side; NRI's spec generator then
// folds them to the last). Device variables are narrowed through CDI
// instead, which appends; anything else, or a node whose CDI specs cannot
// name the allocation, gets the container refused, with the reason.
func (r *Rules) decideRepeated(d *Decision, env map[string]string, counts map[string]int, g grant) (refuse string) {
	var repeated []string
	for _, name := range slices.Sorted(maps.Keys(d.SetEnv)) {
		switch {
		case counts[name] <= 1:
		case !slices.Contains(r.policy.DeviceVariables(), name):
			// The enforcer's CDI device voids device variables only.
			return refusal(name, counts[name], env[name], "it cannot be changed at the node")
		default:
			repeated = append(repeated, name)
		}
	}
	if len(repeated) == 0 {
		return ""
	}
	first := repeated[0]
	if r.cdi == nil {
		return refusal(first, counts[first], env[first], "this node enforcer has no CDI spec directory to narrow it through")
	}
	if g.unknown {
		return refusal(first, counts[first], env[first], "the allocation names devices gpuguard cannot name through CDI")
	}
	inject, err := r.cdi.Qualify(g.devices)
	if err != nil {
		return refusal(first, counts[first], env[first], err.Error())
	}
	for _, name := range repeated {
		delete(d.SetEnv, name)
		d.Changes = slices.DeleteFunc(d.Changes, func(c string) bool { return strings.HasPrefix(c, "set "+name+"=") })
		d.Changes = append(d.Changes, fmt.Sprintf("set %s=void through CDI, with the allocated devices (it was set %d times; the runtime would have read %q)",
			name, counts[name], env[name]))
	}
	d.InjectCDI = inject
	d.Changes = append(d.Changes, "injected CDI devices "+strings.Join(inject, ","))
	return ""
}

func refusal(name string, count int, value, why string) string {
	return fmt.Sprintf("gpuguard: %s is set %d times in the container's environment (image, device plugin, pod) and the runtime would honour the last, %q, which grants more than the kubelet allocated; %s: remove it from the pod's env and envFrom",
		name, count, value, why)
}

// decideKAIList refuses a KAI fraction container whose device variable
// names more than the GPUs KAI bound it to. It is not narrowed: the GPUs
// bound are found through the GPU group label of the pod, which its owner
// may change, while the list comes from the ConfigMap only KAI's binder
// writes; a list and a group that disagree grant nothing either says.
func (r *Rules) decideKAIList(env map[string]string, g grant, fraction bool) (refuse string) {
	if !fraction {
		return ""
	}
	for _, name := range r.policy.DeviceVariables() {
		if value, set := env[name]; set && !g.covers(value, r.deviceListRoots) {
			return fmt.Sprintf("gpuguard: %s of the KAI Scheduler fraction container is %q, which names more than %s, the GPU KAI bound it to (the kubelet's allocation to the reservation pod of its GPU group); remove it from the pod, or have KAI bind the pod again",
				name, value, strings.Join(g.visible, ","))
		}
	}
	return ""
}

// decideDeviceVariables sets each device variable to the allocation: void
// without one, the allocated devices with one, wherever a value would
// grant more.
func (r *Rules) decideDeviceVariables(d *Decision, env map[string]string, g grant) {
	want := Void
	if len(g.visible) > 0 {
		want = strings.Join(g.visible, ",")
	}
	for i, name := range r.policy.DeviceVariables() {
		value, set := env[name]
		switch {
		case set && g.covers(value, r.deviceListRoots):
			continue
		case !set && !(i == 0 && hasKey(env, cudaVersionEnv)):
			continue // unset grants nothing, unless the legacy-image rule applies
		}
		d.SetEnv[name] = want
		d.Changes = append(d.Changes, fmt.Sprintf("set %s=%s (was %s)", name, want, describe(value, set)))
	}
}

// decideMounts removes device-list mounts of devices not allocated. The
// toolkit matches its root as a plain string prefix of the cleaned
// destination and reads what follows, slashes trimmed, as the device:
// /var/run/nvidia-container-devicesall asks for "all" as
// /var/run/nvidia-container-devices/all does; so does the enforcer.
func (r *Rules) decideMounts(d *Decision, mounts []Mount, g grant) {
	for _, m := range mounts {
		for _, root := range r.deviceListRoots {
			rest, ok := strings.CutPrefix(path.Clean(m.Destination), path.Clean(root))
			if !ok {
				continue
			}
			if rest = strings.Trim(rest, "/"); rest == "" || !g.names[rest] {
				d.RemoveMounts = append(d.RemoveMounts, m.Destination)
				d.Changes = append(d.Changes, "removed device-list mount "+m.Destination+": not allocated")
			}
			break
		}
	}
}

// decideAnnotations removes CDI device requests that name a device not
// allocated.
func (r *Rules) decideAnnotations(d *Decision, annotations map[string]string, g grant) {
	for _, key := range slices.Sorted(maps.Keys(annotations)) {
		if !slices.ContainsFunc(r.cdiPrefixes, func(p string) bool { return strings.HasPrefix(key, p) }) {
			continue
		}
		for name := range strings.SplitSeq(annotations[key], ",") {
			_, device, _ := strings.Cut(strings.TrimSpace(name), "=")
			if !g.names[device] {
				d.RemoveAnnotations = append(d.RemoveAnnotations, key)
				d.Changes = append(d.Changes, fmt.Sprintf("removed annotation %s: %q is not allocated", key, name))
				break
			}
		}
	}
}

// NVIDIACDIAnnotation is the pod annotation key from which NVIDIA's NRI
// plugin (the GPU Operator's cdi.nriPluginEnabled) injects CDI devices:
// nvidia.cdi.k8s.io/container.<name>, else nvidia.cdi.k8s.io/pod, else
// nvidia.cdi.k8s.io itself (NRI's GetEffectiveAnnotation), each a comma
// list of CDI device names.
const NVIDIACDIAnnotation = "nvidia.cdi.k8s.io"

// decidePodAnnotations refuses a container whose pod's annotations ask an
// NRI plugin for a CDI device not allocated to it. A pod's annotations
// cannot be removed through NRI (an adjustment removes the container's
// OCI annotations only), and the plugin may run before or after the
// enforcer: the container is refused, naming the annotation; whichever
// plugin injects the device, validation judges it too. Every key that
// applies to the container is judged, not only the one the plugin would
// read first.
func (r *Rules) decidePodAnnotations(c Container, g grant) (refuse string) {
	for _, base := range r.podCDIKeys {
		for _, key := range []string{base + "/container." + c.Name, base + "/pod", base} {
			value, ok := c.PodAnnotations[key]
			if !ok {
				continue
			}
			for name := range strings.SplitSeq(value, ",") {
				name = strings.TrimSpace(name)
				if name == "" {
					continue
				}
				device := name
				if _, d, qualified := strings.Cut(name, "="); qualified {
					device = d
				}
				if !g.names[device] {
					return fmt.Sprintf("gpuguard: the pod's annotation %s asks an NRI plugin for CDI device %q, which the kubelet did not allocate to the container; NRI cannot remove a pod's annotation: remove it from the pod, or exempt its service account",
						key, name)
				}
			}
		}
	}
	return ""
}

// envMap reads an environment as the runtime does, the last occurrence
// winning, and counts each key's occurrences.
func envMap(env []string) (values map[string]string, counts map[string]int) {
	values, counts = make(map[string]string, len(env)), make(map[string]int, len(env))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		values[k] = v
		counts[k]++
	}
	return values, counts
}

func hasKey(m map[string]string, k string) bool {
	_, ok := m[k]
	return ok
}

func describe(value string, set bool) string {
	if !set {
		return "unset"
	}
	return strconv.Quote(value)
}
