package verifier

import "github.com/prometheus/client_golang/prometheus"

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
	reg.MustRegister(m.Unallocated, m.Passes, m.Containers, m.Evictions, m.Unverified)
	return m
}

// setFindings replaces the finding series with this pass's.
func (m *Metrics) setFindings(findings []Finding) {
	counts := map[ContainerKey]float64{}
	for _, f := range findings {
		// Unverifiable containers have their own gauge: how many GPUs they
		// reach is unknown.
		if f.Exempt == "" && f.SeenBy != SeenByUnverifiable {
			counts[f.Container.Key]++
		}
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
