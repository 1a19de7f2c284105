package servingcert

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpuguard/gpuguard/testsupport/testcerts"
)

func TestExpiryCollectorReportsNotAfter(t *testing.T) {
	dir := t.TempDir()
	c := NewExpiryCollector(dir, "tls.crt")
	if n := testutil.CollectAndCount(c); n != 0 {
		t.Errorf("%d samples without a certificate, want none", n)
	}
	ca, err := testcerts.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.WriteServing(dir); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "tls.crt"))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(c); got != float64(cert.NotAfter.Unix()) {
		t.Errorf("expiry %v, want %v", got, cert.NotAfter.Unix())
	}
}
