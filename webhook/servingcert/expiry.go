package servingcert

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"
)

// expiryDesc is the serving certificate's end of validity.
var expiryDesc = prometheus.NewDesc("gpuguard_serving_certificate_expiry_timestamp_seconds",
	"When the serving certificate the webhook reads from its certificate directory stops being valid (its NotAfter), as a Unix time.",
	nil, nil)

// ExpiryCollector reports the NotAfter of the certificate in dir/certName
// at every scrape, whoever wrote it (gpuguard, cert-manager, a mounted
// Secret), so that an alert fires before it lapses. An unreadable file
// gives no sample: the webhook's readiness already says it cannot serve.
type ExpiryCollector struct {
	path string
}

// NewExpiryCollector reads dir/certName.
func NewExpiryCollector(dir, certName string) *ExpiryCollector {
	return &ExpiryCollector{path: filepath.Join(dir, certName)}
}

// Describe implements prometheus.Collector.
func (c *ExpiryCollector) Describe(ch chan<- *prometheus.Desc) { ch <- expiryDesc }

// Collect implements prometheus.Collector.
func (c *ExpiryCollector) Collect(ch chan<- prometheus.Metric) {
	data, err := os.ReadFile(c.path)
	if err != nil {
		return
	}
	block, _ := pem.Decode(data)
	if block == nil {
		return
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(expiryDesc, prometheus.GaugeValue, float64(cert.NotAfter.Unix()))
}
