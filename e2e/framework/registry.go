package framework

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"path/filepath"
	"time"

	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"

	"github.com/gpuguard/gpuguard/testsupport/testcerts"
)

// Registry is an OCI registry on this machine's loopback, as a team's own
// would be: go-containerregistry's, with referrers, over TLS with a
// certificate of its own CA. Nothing trusts the CA until told: containerd
// through a hosts.toml, helm and Go clients through SSL_CERT_FILE.
type Registry struct {
	// Host is 127.0.0.1:PORT.
	Host string
	// CAFile is the CA's certificate (PEM).
	CAFile string
	ca     *testcerts.CA
	srv    *http.Server
	done   chan error
}

// StartRegistry serves an empty registry; its certificates go into dir.
func StartRegistry(dir string) (*Registry, error) {
	ca, err := testcerts.NewCA()
	if err != nil {
		return nil, err
	}
	r := &Registry{CAFile: filepath.Join(dir, "registry-ca.crt"), ca: ca, done: make(chan error, 1)}
	if err := testcerts.WriteAtomic(r.CAFile, ca.PEM); err != nil {
		return nil, err
	}
	crt, key := filepath.Join(dir, "registry.crt"), filepath.Join(dir, "registry.key")
	leaf := testcerts.Leaf{CommonName: "registry", DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Server: true}
	if err := ca.WriteLeaf(crt, key, leaf); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r.Host = ln.Addr().String()
	r.srv = &http.Server{
		Handler:           ggcrregistry.New(ggcrregistry.WithReferrersSupport(true), ggcrregistry.Logger(log.New(io.Discard, "", 0))),
		ReadHeaderTimeout: 30 * time.Second,
		// HTTP/1.1 only. The in-memory registry reads an upload's body while
		// holding its blob lock; over HTTP/2 two concurrent uploads share one
		// connection's flow-control window, the second, waiting for the lock,
		// stops reading, and the first never gets the rest of its body (a push
		// hung that way). One connection per upload keeps them apart.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
	}
	go func() { r.done <- r.srv.ServeTLS(ln, crt, key) }()
	return r, nil
}

// Transport trusts the registry's CA, for pushing from this process.
func (r *Registry) Transport() http.RoundTripper {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = &tls.Config{RootCAs: r.ca.Pool(), MinVersion: tls.VersionTLS12}
	return t
}

// Stop closes the registry: gracefully for a few seconds, then whatever
// connection a client left open (Shutdown alone waits for it forever).
func (r *Registry) Stop(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := r.srv.Shutdown(ctx); err != nil {
		if cerr := r.srv.Close(); cerr != nil {
			return errors.Join(err, cerr)
		}
	}
	if err := <-r.done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("registry: %w", err)
	}
	return nil
}
