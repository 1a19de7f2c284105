package plugin

import "github.com/prometheus/client_golang/prometheus"

// Metrics of the device plugins.
type Metrics struct {
	allocations *prometheus.CounterVec
	devices     *prometheus.GaugeVec
	registered  *prometheus.GaugeVec
}

// NewMetrics registers the plugin metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		allocations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuguard_agent_allocations_total",
			Help: "Allocate calls by resource and result (ok, rejected).",
		}, []string{"resource", "result"}),
		devices: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpuguard_agent_devices",
			Help: "Devices served by resource and health.",
		}, []string{"resource", "health"}),
		registered: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpuguard_agent_plugin_registered",
			Help: "1 while the resource's plugin is registered with the kubelet.",
		}, []string{"resource"}),
	}
	reg.MustRegister(m.allocations, m.devices, m.registered)
	return m
}
