package verifier

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// maxFindingSeries bounds the per-container series of the finding metric; the
// rest are counted under the label value overflowLabel.
const maxFindingSeries = 200

const overflowLabel = "_other"

// Metrics are the verifier's Prometheus metrics.
type Metrics struct {
	Unallocated *prometheus.GaugeVec
	Passes      *prometheus.CounterVec
	Containers  prometheus.Gauge
	Evictions   *prometheus.CounterVec
	Unverified  *prometheus.GaugeVec
	// Exempt counts what exemptions let through, by exemption: bounded by
	// the policy's list, not by the pods.
	Exempt *prometheus.GaugeVec
}

// NewMetrics registers the verifier's metrics.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Unallocated: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpuguard_agent_unallocated_gpu_access",
			Help: "GPUs a running container can open that the kubelet did not allocate to it, by container (exempt pods are not counted). At most 200 series; the rest under namespace=\"_other\".",
		}, []string{"namespace", "pod", "container"}),
		Passes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuguard_agent_verify_passes_total",
			Help: "Verifier passes over the node's running containers, by result (ok, error).",
		}, []string{"result"}),
		Containers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpuguard_agent_verify_containers",
			Help: "Running containers the last verifier pass looked at.",
		}),
		Evictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuguard_agent_verify_evictions_total",
			Help: "Containers the verifier stopped in enforce mode (through the runtime, then deleting the pod outside the Eviction API), by result (stopped, error).",
		}, []string{"result"}),
	}
	m.Unverified = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuguard_agent_verify_unverified_containers",
		Help: "Running containers the last pass could not look into, by reason: gone (ended meanwhile, or a root the agent may not read) or dev-too-large (more than 10000 entries under /dev).",
	}, []string{"reason"})
	m.Exempt = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuguard_agent_exempt_gpu_access",
		Help: "GPUs running containers can open without a kubelet allocation because an exemption covers them, by exemption (\"namespace NS\", \"service account NS/NAME\", a KAI fraction).",
	}, []string{"exemption"})
	reg.MustRegister(m.Unallocated, m.Passes, m.Containers, m.Evictions, m.Unverified, m.Exempt)
	return m
}

// setFindings replaces the finding series with this pass's.
func (m *Metrics) setFindings(findings []Finding) {
	counts := map[ContainerKey]float64{}
	exempt := map[string]float64{}
	for _, f := range findings {
		switch {
		case f.SeenBy == SeenByUnverifiable:
			// Unverifiable containers have their own gauge: how many GPUs
			// they reach is unknown.
		case f.Exempt != "":
			exempt[exemptionKind(f.Exempt)]++
		default:
			counts[f.Container.Key]++
		}
	}
	m.Exempt.Reset()
	for e, v := range exempt {
		m.Exempt.WithLabelValues(e).Set(v)
	}
	m.Unallocated.Reset()
	n := 0
	for k, v := range counts {
		if n >= maxFindingSeries {
			m.Unallocated.WithLabelValues(overflowLabel, overflowLabel, overflowLabel).Add(v)
			continue
		}
		m.Unallocated.WithLabelValues(k.Namespace, k.Pod, k.Container).Set(v)
		n++
	}
}

// exemptionKind is the exemption label of a finding: a KAI fraction's GPU
// count left out, so the series are as many as the policy's exemptions.
func exemptionKind(exempt string) string {
	if strings.HasPrefix(exempt, "KAI Scheduler fraction") {
		return "KAI Scheduler fraction"
	}
	return exempt
}
