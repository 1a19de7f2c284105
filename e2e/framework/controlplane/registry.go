package controlplane

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
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
	// private, when set, is the repository path under which every request
	// needs its credentials (Protect).
	private atomic.Pointer[privatePath]
}

// privatePath is a path of the registry that needs credentials, as a
// team's private registry does.
type privatePath struct {
	prefix, user, password string
}

// Protect makes every request for a repository under prefix (images and
// charts alike) need HTTP basic credentials user and password: without
// them the registry answers 401 with a Basic challenge, which containerd
// answers with a pod's image pull secret, helm and go-containerregistry with
// the credentials in DOCKER_CONFIG. The rest of the registry stays open.
// An empty prefix protects the whole registry.
func (r *Registry) Protect(prefix, user, password string) {
	path := "/v2/"
	if p := strings.Trim(prefix, "/"); p != "" {
		path += p + "/"
	}
	r.private.Store(&privatePath{prefix: path, user: user, password: password})
}

// WriteDockerConfig writes into dir the config.json that docker login
// would write for registry, where helm, go-containerregistry (through
// DOCKER_CONFIG) and an image pull secret made from it find it.
func WriteDockerConfig(dir, registry, user, password string) error {
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + password))
	config, err := json.Marshal(map[string]any{"auths": map[string]any{registry: map[string]string{"auth": auth}}})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "config.json"), config, 0o600)
}

// authorize answers a request for a protected repository without its
// credentials; it reports whether the request may go on.
func (r *Registry) authorize(w http.ResponseWriter, req *http.Request) bool {
	p := r.private.Load()
	if p == nil || !strings.HasPrefix(req.URL.Path, p.prefix) {
		return true
	}
	user, password, ok := req.BasicAuth()
	if ok && subtle.ConstantTimeCompare([]byte(user+"\x00"+password), []byte(p.user+"\x00"+p.password)) == 1 {
		return true
	}
	w.Header().Set("WWW-Authenticate", `Basic realm="registry"`)
	http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"credentials required"}]}`, http.StatusUnauthorized)
	return false
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
		Handler:           r.guard(ggcrregistry.New(ggcrregistry.WithReferrersSupport(true), ggcrregistry.Logger(log.New(io.Discard, "", 0)))),
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

// guard puts authorize in front of the registry.
func (r *Registry) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if r.authorize(w, req) {
			next.ServeHTTP(w, req)
		}
	})
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
