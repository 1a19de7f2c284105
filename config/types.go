// Package config defines gpuguard's policy document (apiVersion gpuguard.io/v1alpha1,
// kind GPUGuardPolicy): its schema, the embedded default, strict parsing and validation.
//
// The document is what platform teams edit. Every field is optional: a field left out
// keeps the value of the embedded default policy (default.yaml), and a list that is set
// replaces the default list whole.
package config

// APIVersion and Kind identify a gpuguard policy document.
const (
	APIVersion = "gpuguard.io/v1alpha1"
	Kind       = "GPUGuardPolicy"
)

// VisibleDevicesEnv is the variable the NVIDIA Container Toolkit reads as a container's
// device list. It is always treated as a device variable, whatever the policy says.
const VisibleDevicesEnv = "NVIDIA_VISIBLE_DEVICES"

// Policy is the whole policy document.
type Policy struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   Metadata   `json:"metadata,omitempty"`
	Spec       PolicySpec `json:"spec"`
}

// Metadata names a policy; the name shows up in logs and metrics only.
type Metadata struct {
	Name string `json:"name,omitempty"`
}

// PolicySpec holds every setting of a policy.
type PolicySpec struct {
	// Mode decides what a violation does: enforce denies, warn allows with admission
	// warnings, audit allows and records audit annotations.
	Mode Mode `json:"mode"`
	// NamespaceModeOverride says how the namespace label gpuguard.io/mode may change
	// Mode for one namespace: TightenOnly (default) or Any.
	NamespaceModeOverride ModeOverride `json:"namespaceModeOverride"`
	// Action is what happens to explicit NVIDIA variables that break the policy:
	// deny the pod, or strip the offending env entries in the mutating phase.
	Action Action `json:"action"`
	// InjectVoid makes the mutating phase set NVIDIA_VISIBLE_DEVICES=void (and every
	// other device variable) in every container without GPU resources, and makes the
	// validating phase deny such a container left without it.
	InjectVoid bool `json:"injectVoid"`
	// GPUResources are the resource names (with * wildcards) whose presence in a
	// container's limits, with a quantity above zero, makes it a GPU container.
	GPUResources []string `json:"gpuResources"`
	// Env sets which environment variables are protected and where they are allowed.
	Env EnvPolicy `json:"env"`
	// Annotations is the pod annotation deny-list.
	Annotations AnnotationPolicy `json:"annotations"`
	// DeviceListMountRoots are the directories under which a volume mount requests
	// devices from the toolkit; matched as plain string prefixes of the cleaned path.
	DeviceListMountRoots []string `json:"deviceListMountRoots"`
	// SensitiveHostPaths may not be mounted as hostPath volumes, nor may any path
	// below them; a path above them only as SensitiveHostPathParents says.
	SensitiveHostPaths []string `json:"sensitiveHostPaths"`
	// SensitiveHostPathParents says how a host path above a sensitive one (/,
	// /var) is treated: readOnlyUnprivileged (default) admits it where every
	// container mounting it is read-only, non-root and unprivileged; deny
	// denies it, for nodes where a socket belongs to a group pods may take.
	SensitiveHostPathParents ParentAction `json:"sensitiveHostPathParents"`
	// WriteProtectedHostPaths are the host's system directories: what the
	// node runs, loads or trusts as root (binaries, libraries, the dynamic
	// linker's and the runtimes' configuration, credentials, other
	// containers' filesystems). A hostPath volume at, below or above one is
	// admitted only where every container mounting it mounts it readOnly,
	// unless it lies at or below one of WritableHostPaths.
	//
	// The class is inverted on purpose: a list of what must not be written
	// misses the next distribution's prefix; a list of the host's top-level
	// system directories and of the data directories inside them does not.
	WriteProtectedHostPaths []string `json:"writeProtectedHostPaths"`
	// WritableHostPaths are data directories inside the write-protected and
	// runtime-state trees (log directories, local storage roots, agents'
	// socket directories): a hostPath volume at or below one may be mounted
	// read-write, and needs none of the conditions of RuntimeStateHostPaths.
	// Sensitive paths stay denied below them. An entry is a path (every
	// pod's) or a path scoped to the service accounts or namespaces that own
	// it (WritableHostPath): outside its scope it is write-protected.
	WritableHostPaths []WritableHostPath `json:"writableHostPaths"`
	// RuntimeStateHostPaths are the trees where container runtimes, the
	// kubelet and Kubernetes distributions keep sockets, credentials and
	// other pods' volumes. A hostPath volume at, below or above one is
	// treated as a parent of a sensitive path (SensitiveHostPathParents):
	// read-only, by a non-root container without privilege, unless it lies
	// at or below one of WritableHostPaths.
	RuntimeStateHostPaths []string `json:"runtimeStateHostPaths"`
	// NVIDIARuntimeClasses are the RuntimeClass names that run a pod through the
	// NVIDIA Container Runtime.
	NVIDIARuntimeClasses []string `json:"nvidiaRuntimeClasses"`
	// AllowedCapabilities are the capabilities a container may add
	// (securityContext.capabilities.add), written without CAP_; any other
	// is denied (rule added-capabilities) outside exempt workloads. The
	// default is Pod Security baseline's list plus IPC_LOCK.
	AllowedCapabilities []string `json:"allowedCapabilities"`
	// Advisories sets the effect of the advisory rules.
	Advisories Advisories `json:"advisories"`
	// Exemptions lists what gpuguard leaves untouched.
	Exemptions Exemptions `json:"exemptions"`
	// Integrations accept the device channels of GPU-sharing schedulers that
	// gpuguard can check exactly.
	Integrations Integrations `json:"integrations"`
}

// Integrations configures what gpuguard accepts from other GPU stacks.
type Integrations struct {
	// KAIScheduler accepts KAI Scheduler's fractional GPUs.
	KAIScheduler KAIScheduler `json:"kaiScheduler"`
}

// KAIScheduler configures the KAI Scheduler fraction integration. When on, the
// fraction container of a pod that KAI schedules may take NVIDIA_VISIBLE_DEVICES
// from the one ConfigMap KAI's binder writes for it, instead of void.
type KAIScheduler struct {
	// Fractions turns the integration on.
	Fractions bool `json:"fractions"`
	// SchedulerNames are KAI's scheduler names (its --scheduler-name).
	SchedulerNames []string `json:"schedulerNames"`
	// BinderServiceAccounts are the KAI binder's accounts, as
	// "system:serviceaccount:NAMESPACE:NAME": the only writers of the
	// fraction ConfigMaps (the chart's ConfigMap guard enforces it).
	BinderServiceAccounts []string `json:"binderServiceAccounts"`
	// ReservationNamespace is where KAI's binder runs its GPU reservation
	// pods (KAI's binder.resourceReservation.namespace); empty is KAI's
	// default, kai-resource-reservation. The node enforcer holds a fraction
	// container to the GPU the kubelet allocated to its reservation pod.
	ReservationNamespace string `json:"reservationNamespace,omitempty"`
}

// DefaultKAIReservationNamespace is KAI's default namespace of its GPU
// reservation pods (constants.DefaultResourceReservationName).
const DefaultKAIReservationNamespace = "kai-resource-reservation"

// Reservations is the namespace of KAI's GPU reservation pods.
func (k KAIScheduler) Reservations() string {
	if k.ReservationNamespace == "" {
		return DefaultKAIReservationNamespace
	}
	return k.ReservationNamespace
}

// EnvPolicy configures the environment rules.
type EnvPolicy struct {
	// ExtraDeviceVariables are treated like NVIDIA_VISIBLE_DEVICES: a toolkit
	// swarm-resource variable (DOCKER_RESOURCE_GPU, say) replaces it as the device list.
	ExtraDeviceVariables []string `json:"extraDeviceVariables"`
	// ProtectedVariables are the other variables that grant device access or driver
	// features. No container may set them unless an entry allows it.
	ProtectedVariables []ProtectedVariable `json:"protectedVariables"`
	// UnprefixedEnvFromOnGPU says how envFrom without a prefix on a GPU container is
	// treated: inspect the ConfigMap where known, warn, or deny.
	UnprefixedEnvFromOnGPU EnvFromAction `json:"unprefixedEnvFromOnGPU"`
}

// ProtectedVariable is one protected environment variable.
type ProtectedVariable struct {
	Name string `json:"name"`
	// AllowOnGPUContainers lets containers with GPU resources set the variable.
	AllowOnGPUContainers bool `json:"allowOnGPUContainers,omitempty"`
	// AllowedValues, when not empty, restricts an allowed variable to these values;
	// a comma-separated value must consist of allowed items only.
	AllowedValues []string `json:"allowedValues,omitempty"`
}

// AnnotationPolicy is the pod annotation deny-list, and the warning for
// annotations of injectors that the list does not name.
type AnnotationPolicy struct {
	// DeniedPrefixes deny every annotation key that starts with one of them.
	DeniedPrefixes []string `json:"deniedPrefixes"`
	// DeniedKeys deny these exact keys.
	DeniedKeys []string `json:"deniedKeys"`
	// SuspectDomainLabels make an annotation a suspected device request when a
	// label of its key's domain (the part before "/", or the whole key without
	// one, split at "." and "-") is one of them: the naming of annotation-driven
	// injectors that no deny-list can name in advance. Such keys get a warning.
	SuspectDomainLabels []string `json:"suspectDomainLabels"`
	// IgnoredPrefixes are keys known to be no device request, never warned
	// about (e.g. KubeVirt's cdi.kubevirt.io/ data importer).
	IgnoredPrefixes []string `json:"ignoredPrefixes"`
}

// Advisories sets the effect of the advisory rules: Warn or Deny.
type Advisories struct {
	// NVIDIARuntimeClass fires on a pod that runs with an NVIDIA runtime class
	// but has no GPU container.
	NVIDIARuntimeClass Severity `json:"nvidiaRuntimeClass"`
	// Privileged fires on a privileged container: it sees every device node of
	// the node, every GPU included, whatever it was allocated.
	Privileged Severity `json:"privileged"`
	// Capabilities fires on a container that adds SYS_ADMIN or ALL: the toolkit
	// counts it as privileged and gives it the devices its environment asks
	// for (the device cgroup included), so such a container without a GPU
	// limit gets void whatever InjectVoid says.
	Capabilities Severity `json:"capabilities"`
}

// Exemptions lists requests gpuguard allows untouched.
type Exemptions struct {
	// ServiceAccounts exempts pods (and pod templates) of a namespace that run as
	// a service account, from the rules each entry names. The requesting user
	// says nothing about a workload, whose pods are created by controllers; the
	// pod's serviceAccountName does.
	ServiceAccounts []ServiceAccountExemption `json:"serviceAccounts"`
	// Namespaces exempts whole namespaces. Allowed, but reported as broad.
	Namespaces []string `json:"namespaces"`
	// Usernames exempts requests by these users (humans and tools).
	Usernames []string `json:"usernames"`
}

// ServiceAccountRef names a service account in a namespace.
type ServiceAccountRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

// ServiceAccountExemption waives rules for the pods of a namespace that run
// as a service account.
type ServiceAccountExemption struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Rules are the IDs of the rules waived (`gpuguard rules` lists them);
	// none means every rule, which is reported as broad. An exemption that
	// names only what its workload needs leaves the rest of the policy in
	// force: a DCGM exporter may keep its GPUs without being let run
	// privileged. Two entries for one pair add up.
	Rules []string `json:"rules,omitempty"`
}

// Ref is the pair the exemption is for.
func (e ServiceAccountExemption) Ref() ServiceAccountRef {
	return ServiceAccountRef{Namespace: e.Namespace, Name: e.Name}
}

// Mode is what a violation does.
type Mode string

// Modes, from strictest to loosest.
const (
	ModeEnforce Mode = "enforce"
	ModeWarn    Mode = "warn"
	ModeAudit   Mode = "audit"
)

// Modes lists the valid modes.
var Modes = []string{string(ModeEnforce), string(ModeWarn), string(ModeAudit)}

// Strictness orders modes: higher is stricter. Unknown modes rank lowest.
func (m Mode) Strictness() int {
	switch m {
	case ModeEnforce:
		return 3
	case ModeWarn:
		return 2
	case ModeAudit:
		return 1
	}
	return 0
}

// ModeOverride says how a namespace label may change the mode.
type ModeOverride string

// Override kinds.
const (
	OverrideTightenOnly ModeOverride = "TightenOnly"
	OverrideAny         ModeOverride = "Any"
)

// Action is what happens to an explicit variable violation.
type Action string

// Actions.
const (
	ActionDeny  Action = "deny"
	ActionStrip Action = "strip"
)

// ParentAction is the treatment of host paths above sensitive paths.
type ParentAction string

// Parent treatments.
const (
	ParentsReadOnlyUnprivileged ParentAction = "readOnlyUnprivileged"
	ParentsDeny                 ParentAction = "deny"
)

// EnvFromAction is the treatment of prefix-less envFrom on GPU containers.
type EnvFromAction string

// EnvFrom treatments.
const (
	EnvFromInspect EnvFromAction = "inspect"
	EnvFromWarn    EnvFromAction = "warn"
	EnvFromDeny    EnvFromAction = "deny"
)

// Severity is the effect of an advisory rule.
type Severity string

// Severities.
const (
	SeverityWarn Severity = "warn"
	SeverityDeny Severity = "deny"
)
