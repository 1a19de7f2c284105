package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/net/netutil"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
)

// reviewServer serves /mutate and /validate over TLS. It is gpuguard's own
// rather than controller-runtime's webhook server, which fixes the limits
// an idle or hostile connection holds memory under (1 MiB of headers for 32
// seconds, and no bound on connections): here Limits set them.
type reviewServer struct {
	serving Serving
	limits  Limits
	mux     *http.ServeMux
	log     logr.Logger
	started atomic.Bool
}

func newReviewServer(s Serving, l Limits, log logr.Logger) *reviewServer {
	return &reviewServer{serving: s, limits: l, mux: http.NewServeMux(), log: log}
}

// Register serves h at path.
func (s *reviewServer) Register(path string, h http.Handler) { s.mux.Handle(path, h) }

// StartedChecker is healthy once the server listens. Unlike
// controller-runtime's, it does not dial the server: a check must not take
// one of the connections MaxConnections allows, nor fail because all of
// them are taken.
func (s *reviewServer) StartedChecker() healthz.Checker {
	return func(*http.Request) error {
		if !s.started.Load() {
			return errors.New("webhook server has not been started yet")
		}
		return nil
	}
}

// httpServer is the server's http.Server: the request line and headers of
// each request are bounded in size (MaxHeaderBytes, then HTTP 431) and in
// time (ReadHeaderTimeout, which also bounds the TLS handshake: net/http
// sets a connection's handshake deadline from the shortest of ReadTimeout,
// ReadHeaderTimeout and WriteTimeout), and an idle keep-alive connection
// is closed after IdleTimeout.
func (s *reviewServer) httpServer(ctx context.Context) *http.Server {
	return &http.Server{
		Handler:           s.mux,
		BaseContext:       func(net.Listener) context.Context { return ctx },
		MaxHeaderBytes:    s.limits.MaxHeaderBytes,
		ReadHeaderTimeout: s.limits.ReadHeaderTimeout,
		IdleTimeout:       s.limits.IdleTimeout,
	}
}

// listen opens the TLS listener: at most MaxConnections connections are
// accepted at once (netutil.LimitListener); more wait, unaccepted, in the
// kernel's queue until one closes. The bound counts a connection from
// before its TLS handshake to its close.
func (s *reviewServer) listen(cfg *tls.Config) (net.Listener, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(s.serving.Host, strconv.Itoa(s.serving.Port)))
	if err != nil {
		return nil, err
	}
	return tls.NewListener(netutil.LimitListener(l, s.limits.MaxConnections), cfg), nil
}

// Start serves until ctx is done, then finishes the requests in flight
// (up to a minute) and returns.
func (s *reviewServer) Start(ctx context.Context) error {
	watcher, err := certwatcher.New(filepath.Join(s.serving.CertDir, s.serving.CertName), filepath.Join(s.serving.CertDir, s.serving.KeyName))
	if err != nil {
		return fmt.Errorf("loading the serving certificate: %w", err)
	}
	go func() {
		if err := watcher.Start(ctx); err != nil {
			s.log.Error(err, "certificate watcher stopped")
		}
	}()
	cfg := &tls.Config{GetCertificate: watcher.GetCertificate}
	for _, opt := range tlsOptions(s.serving.EnableHTTP2) {
		opt(cfg)
	}
	if cfg.NextProtos == nil {
		// The listener is this server's, so net/http cannot add HTTP/2
		// to what it offers.
		cfg.NextProtos = []string{"h2", "http/1.1"}
	}
	l, err := s.listen(cfg)
	if err != nil {
		return err
	}
	srv := s.httpServer(ctx)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := srv.Shutdown(shutdown); err != nil {
			s.log.Error(err, "shutting down the webhook server")
		}
	}()
	s.log.Info("serving webhook", "address", l.Addr().String(), "maxConnections", s.limits.MaxConnections,
		"maxHeaderBytes", s.limits.MaxHeaderBytes, "readHeaderTimeout", s.limits.ReadHeaderTimeout)
	s.started.Store(true)
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	<-stopped
	return nil
}
