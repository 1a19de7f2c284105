// Package wellknown holds the names gpuguard writes into a cluster or onto a
// node and reads back: labels, Event reasons and sources, field managers and
// the CDI kind of its device specs. The webhook, the agent, the CLI and the
// chart all mean the same object by each, so each is defined here and nowhere
// else: a rename on one side cannot silently split them (the chart is checked
// against this package by charts/names_test.go; metric names are checked
// against the chart's alerts and dashboard by charts/observability_test.go).
package wellknown

// Domain is gpuguard's own name space for labels and kinds.
const Domain = "gpuguard.io"

// Labels gpuguard reads.
const (
	// ModeLabel on a Namespace changes the policy's mode for it, where the
	// policy's namespaceModeOverride lets it.
	ModeLabel = Domain + "/mode"
	// HardenedLabel is the agent's summary of its node's hardening report:
	// "true" when no check fails, for node selectors and affinities.
	HardenedLabel = Domain + "/hardened"
	// HardenedMarkLabel carries the same summary where no kubelet can write
	// it: the NodeRestriction admission plugin refuses node identities any
	// label under node-restriction.kubernetes.io/, at registration and after.
	// The webhook's hardened-cluster profile (inject-void=auto), which turns
	// the void injection off, trusts this one only: any kubelet may label its
	// node gpuguard.io/hardened=true.
	HardenedMarkLabel = "node-restriction.kubernetes.io/gpuguard-hardened"
	// EnforcerLeasePrefix names the Lease a node's enforcer holds while it
	// is registered with the runtime: the prefix and the node's name, in
	// the agent's namespace, held by the node's name.
	EnforcerLeasePrefix = "gpuguard-enforcer-"
	// AgentLeasePrefix names the Lease a node's agent holds while it runs
	// and publishes its node's labels: the heartbeat without which the
	// hardened mark goes stale, where the webhook follows Leases.
	AgentLeasePrefix = "gpuguard-agent-"
	// CoverageLeaseSeconds is how long an agent's or enforcer's Lease stays
	// fresh without renewal. The agent writes it; the webhook counts no
	// coverage Lease for longer after a renewal it saw, whatever duration
	// the writer put in it; the chart's coverage-leases policy refuses a
	// longer one.
	CoverageLeaseSeconds = 60
	// AuditLease is the Lease the webhook's replicas elect the background
	// auditor with, in the webhook's namespace.
	AuditLease = "gpuguard-audit"
	// TolerateMissingEnforcerAnnotation is the pod annotation gpuguard
	// names for containerd's tolerate_missing_plugins_annotation, where the
	// node requires the enforcer: the agent's own pods carry it, and the
	// default policy denies it to every pod it judges.
	TolerateMissingEnforcerAnnotation = Domain + "/tolerate-missing-enforcer"
	// CheckLabelPrefix prefixes one node label per hardening check, the
	// check's ID after it, its status as the value.
	CheckLabelPrefix = Domain + "/check."
)

// VoidAnnotation on a pod names, comma-separated in spec order, the
// containers gpuguard's admission gave NVIDIA_VISIBLE_DEVICES=void (the
// webhook and the backstop's MutatingAdmissionPolicy alike): the answer to
// "why does my pod see no GPU". Written at a pod's creation; informational,
// never read back: a pod could set it itself.
const VoidAnnotation = Domain + "/void"

// Labels on the objects gpuguard writes, so that its own can be found (and
// stale ones removed). The component says which part wrote it.
const (
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedBy      = "gpuguard"
	ComponentLabel = "app.kubernetes.io/component"

	ComponentAgent       = "agent"
	ComponentAudit       = "audit"
	ComponentCELBackstop = "cel-backstop"
)

// OwnedLabels are the labels of an object the component writes.
func OwnedLabels(component string) map[string]string {
	return map[string]string{ManagedByLabel: ManagedBy, ComponentLabel: component}
}

// Names of gpuguard's programs, as Event sources, report sources and field
// managers.
const (
	Agent   = "gpuguard-agent"
	Webhook = "gpuguard"
)

// Server-side apply field managers.
const (
	// AgentFieldManager patches the agent's own Node's labels.
	AgentFieldManager = Agent
	// BackstopFieldManager applies the CEL backstop's policies and bindings.
	BackstopFieldManager = Webhook
	// PrefilterFieldManager applies the match condition of the webhook
	// configurations (the pre-filter).
	PrefilterFieldManager = "gpuguard-prefilter"
	// RegistrationFieldManager applies the webhook configurations, once a
	// replica of the webhook is ready.
	RegistrationFieldManager = "gpuguard-registration"
)

// AgentReportingController is the agent's Events' reporting controller.
const AgentReportingController = Domain + "/agent"

// Event reasons. Alerts and runbooks match on them: they do not change.
const (
	// On the policy ConfigMap (the webhook's policy source).
	ReasonPolicyLoaded   = "PolicyLoaded"
	ReasonPolicyInvalid  = "PolicyInvalid"
	ReasonPolicyMissing  = "PolicyMissing"
	ReasonPolicyFallback = "PolicyFallback"
	ReasonBackstopFailed = "BackstopFailed"
	// ReasonUnguardedNamespaceMissing, on the policy ConfigMap: a namespace
	// the webhook configurations leave out does not exist.
	ReasonUnguardedNamespaceMissing = "UnguardedNamespaceMissing"
	// ReasonInjectionProfile: the hardened-cluster profile turned the void
	// injection off or on.
	ReasonInjectionProfile = "InjectionProfile"
	// ReasonUnallocatedGPUAccess, on a pod: the agent's verifier found one
	// of its containers able to open a GPU the kubelet did not allocate it.
	ReasonUnallocatedGPUAccess = "UnallocatedGPUAccess"
	// ReasonContainerAdjusted, on a pod: the node enforcer changed a
	// container's spec to grant only its allocation.
	ReasonContainerAdjusted = "GPUAccessAdjusted"
	// ReasonContainerRefused, on a pod: the node enforcer refused to let a
	// container be created.
	ReasonContainerRefused = "GPUAccessRefused"
)

// Report fields of the OpenReports results gpuguard writes.
const (
	// ReportPolicy is the policy every result names.
	ReportPolicy = "gpuguard"
	// AuditReportSource is the source of the background audit's results.
	AuditReportSource = Webhook
	// AgentReportSource is the source of the agent's node reports.
	AgentReportSource = Agent
)

// CDIKind is the vendor/class of the CDI specs the agent writes.
const CDIKind = Domain + "/gpu"
