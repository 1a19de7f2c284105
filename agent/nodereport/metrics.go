package nodereport

import "github.com/prometheus/client_golang/prometheus"

// Metrics exports the hardening report.
type Metrics struct {
	check    *prometheus.GaugeVec
	hardened prometheus.Gauge
}

// NewMetrics registers the report's gauges with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		check: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpuguard_agent_node_hardening_check",
			Help: "Node hardening checks: 1 for the check's current status, 0 for the others.",
		}, []string{"check", "status"}),
		hardened: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpuguard_agent_node_hardened",
			Help: "1 when no node hardening check fails.",
		}),
	}
	reg.MustRegister(m.check, m.hardened)
	return m
}

// Set publishes a report.
func (m *Metrics) Set(r *Report) {
	for _, c := range r.Checks {
		for _, s := range Statuses {
			v := 0.0
			if c.Status == s {
				v = 1
			}
			m.check.WithLabelValues(c.ID, string(s)).Set(v)
		}
	}
	if r.Hardened() {
		m.hardened.Set(1)
	} else {
		m.hardened.Set(0)
	}
}
