package webhook

import (
	"crypto/x509"
	"testing"

	"github.com/gpuguard/gpuguard/testsupport/testcerts"
)

// writeTestCerts makes a CA and a serving certificate for localhost in dir, and
// returns a pool that trusts the CA.
func writeTestCerts(t testing.TB, dir string) *x509.CertPool {
	t.Helper()
	ca, err := testcerts.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.WriteServing(dir); err != nil {
		t.Fatal(err)
	}
	return ca.Pool()
}
