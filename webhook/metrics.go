package webhook

import (
	"github.com/go-logr/logr"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/gpuguard/gpuguard/webhook/policysource"
)

// Metrics are gpuguard's Prometheus collectors, registered once in
// controller-runtime's registry, which the metrics endpoint serves.
type Metrics struct {
	Decisions *prometheus.CounterVec
	// ByNamespace counts denials and warnings per namespace, bounded
	// (namespaceSeries).
	ByNamespace     *namespaceCounter
	Evaluation      *prometheus.HistogramVec
	PolicyReloads   *prometheus.CounterVec
	PolicyInfo      *prometheus.GaugeVec
	MissingExemptNS prometheus.Gauge
	// MissingUnguardedNS counts the namespaces the webhook configurations
	// leave out that do not exist.
	MissingUnguardedNS prometheus.Gauge
	PolicyFallback     prometheus.Gauge
	ConfigMapLookups   *prometheus.CounterVec
	BackstopSyncs      *prometheus.CounterVec
	PrefilterSyncs     *prometheus.CounterVec
	InjectionOff       prometheus.Gauge
	AuditRuns          *prometheus.CounterVec
	AuditObjects       *prometheus.GaugeVec
	AuditDuration      prometheus.Gauge
	Refused            *prometheus.CounterVec
}

var (
	metricsOnce sync.Once
	metrics     *Metrics
)

// DefaultMetrics returns the process-wide collectors, registering them on first use.
func DefaultMetrics() *Metrics {
	metricsOnce.Do(func() {
		metrics = NewMetrics()
		ctrlmetrics.Registry.MustRegister(metrics.Decisions, metrics.ByNamespace.vec, metrics.Evaluation, metrics.PolicyReloads,
			metrics.PolicyInfo, metrics.MissingExemptNS, metrics.MissingUnguardedNS, metrics.PolicyFallback, metrics.ConfigMapLookups, metrics.BackstopSyncs, metrics.PrefilterSyncs, metrics.InjectionOff,
			metrics.AuditRuns, metrics.AuditObjects, metrics.AuditDuration, metrics.Refused)
	})
	return metrics
}

// NewMetrics makes unregistered collectors, for tests.
func NewMetrics() *Metrics {
	return &Metrics{
		ByNamespace: newNamespaceCounter(prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuguard_admission_namespace_decisions_total",
			Help: "Denials and warnings by namespace (the first 200 namespaces seen get a series each; the rest count as namespace _other) and decision (deny, warn).",
		}, []string{"namespace", "decision"}), namespaceSeries),
		Decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuguard_admission_decisions_total",
			Help: "Admission decisions by phase, operation, kind, decision (allow, mutate, warn, deny, exempt, error) and rule.",
		}, []string{"phase", "operation", "kind", "decision", "rule"}),
		Evaluation: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gpuguard_admission_evaluation_seconds",
			Help:    "Time to decode and evaluate one admission request.",
			Buckets: []float64{25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 50e-3, 0.25, 1},
		}, []string{"phase"}),
		PolicyReloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuguard_policy_reloads_total",
			Help: "Policy loads by result: success, or error (the last good policy stays in force).",
		}, []string{"result"}),
		PolicyInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpuguard_policy_info",
			Help: "The policy in force: 1 for its hash and mode.",
		}, []string{"hash", "mode"}),
		MissingExemptNS: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpuguard_exempt_namespaces_missing",
			Help: "Exempt namespaces of the policy that do not exist; where namespaces are self-service, a tenant could create one.",
		}),
		MissingUnguardedNS: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpuguard_unguarded_namespaces_missing",
			Help: "Namespaces the webhook configurations leave out (admission.systemNamespaces) that do not exist; whoever creates one gets a namespace gpuguard does not guard.",
		}),
		PolicyFallback: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpuguard_policy_fallback",
			Help: "1 while the built-in default policy is in force because the policy ConfigMap has never held a valid policy.",
		}),
		ConfigMapLookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuguard_configmap_lookups_total",
			Help: "ConfigMap reads for envFrom inspection, by result: hit (cache), read, notfound, error.",
		}, []string{"result"}),
		BackstopSyncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuguard_cel_backstop_syncs_total",
			Help: "Server-side applies of the CEL backstop after a policy load, by result: success or error.",
		}, []string{"result"}),
		PrefilterSyncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuguard_prefilter_syncs_total",
			Help: "Server-side applies of the pre-filter match condition to the pod webhooks after a policy load, by result: success or error.",
		}, []string{"result"}),
		InjectionOff: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpuguard_void_injection_off",
			Help: "1 while the hardened-cluster profile (hardening.injectVoid) has the void injection off, 0 while the policy's injection is in force.",
		}),
		AuditRuns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuguard_audit_runs_total",
			Help: "Background audits of what exists in the cluster, by result: success or error.",
		}, []string{"result"}),
		AuditObjects: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpuguard_audit_objects",
			Help: "Existing pods and pod controllers the last background audit judged, by verdict: allow, warn or deny.",
		}, []string{"verdict"}),
		AuditDuration: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpuguard_audit_duration_seconds",
			Help: "How long the last successful background audit took: listing, judging and writing its Reports.",
		}),
		Refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuguard_admission_refused_total",
			Help: "Reviews answered with an HTTP error instead of a verdict, so that the failure policy applies, by reason: no-policy, stopping, overloaded.",
		}, []string{"reason"}),
	}
}

// policySource are the collectors the policy source updates.
func (m *Metrics) policySource() policysource.Metrics {
	return policysource.Metrics{Reloads: m.PolicyReloads, Info: m.PolicyInfo}
}

// NewPolicySource makes an empty policy source that counts in m.
func NewPolicySource(m *Metrics, log logr.Logger) *policysource.Source {
	return policysource.New(m.policySource(), log)
}

// namespaceSeries bounds the namespaces gpuguard_admission_namespace_decisions_total
// names: enough for "which tenant is denied?" on most clusters, and a fixed
// cost where namespaces are created per job.
const namespaceSeries = 200

// otherNamespaces is the namespace label of the namespaces past the bound.
const otherNamespaces = "_other"

// namespaceCounter counts per namespace, the first limit namespaces by
// name and the rest together.
type namespaceCounter struct {
	vec   *prometheus.CounterVec
	limit int
	mu    sync.Mutex
	seen  map[string]bool
}

func newNamespaceCounter(vec *prometheus.CounterVec, limit int) *namespaceCounter {
	return &namespaceCounter{vec: vec, limit: limit, seen: map[string]bool{}}
}

// inc counts one decision in namespace.
func (c *namespaceCounter) inc(namespace, decision string) {
	c.mu.Lock()
	if !c.seen[namespace] {
		if len(c.seen) >= c.limit {
			namespace = otherNamespaces
		} else {
			c.seen[namespace] = true
		}
	}
	c.mu.Unlock()
	c.vec.WithLabelValues(namespace, decision).Inc()
}
