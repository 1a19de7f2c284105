package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/gpuguard/gpuguard/cel"
	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/internal/policysource"
	"github.com/gpuguard/gpuguard/policy"
)

// Paths of the admission endpoints.
const (
	MutatePath   = "/mutate"
	ValidatePath = "/validate"
)

// BuiltinPolicy, as Options.PolicyFile, selects the policy embedded in the binary.
const BuiltinPolicy = "builtin"

// Options configures the webhook server.
type Options struct {
	Host string
	Port int
	// CertDir holds CertName and KeyName, reloaded when they change.
	CertDir, CertName, KeyName string
	// EnableHTTP2 is off by default: HTTP/2 rapid-reset and stream attacks are
	// not worth the gain for admission traffic.
	EnableHTTP2 bool

	// PolicyFile runs standalone, without an API server: a policy file, or
	// BuiltinPolicy. When empty, the policy comes from PolicyConfigMap.
	PolicyFile      string
	PolicyConfigMap types.NamespacedName

	MetricsAddr, ProbeAddr string
	// ConfigMapCacheTTL is how long a ConfigMap read for envFrom inspection is reused.
	ConfigMapCacheTTL time.Duration

	// Certificates managed by gpuguard itself (cert-controller): when CertSecret is
	// set, a CA and serving certificate are kept in that Secret, written to CertDir,
	// rotated, and the CA bundle is injected into the named webhook configurations.
	CertSecret                       types.NamespacedName
	ServiceName                      string
	MutatingConfig, ValidatingConfig string
	ExtraDNSNames                    []string
	// WriteCertDir writes CertSecret's certificate and key into CertDir (which
	// must then be writable) as soon as they change, instead of waiting for
	// the kubelet to refresh a mounted Secret.
	WriteCertDir bool

	// CELBackstop keeps the policy's CEL backstop applied in the cluster, named
	// CELBackstop.Name and leaving out CELBackstop.ExcludedNamespaces.
	CELBackstop *cel.Options

	// Audit, when set, runs the background audit (and writes OpenReports).
	Audit *AuditOptions

	// Limits bound the reviews in flight; zero values take DefaultLimits.
	Limits Limits
	// ShutdownDelay keeps serving this long after ctx is done, reporting not
	// ready, so that the Service stops sending reviews before the server stops.
	ShutdownDelay time.Duration
	// APIReadTimeout bounds each namespace or ConfigMap read a review needs;
	// keep it well under the webhook configurations' timeoutSeconds.
	APIReadTimeout time.Duration

	// RestConfig reaches the API server (not needed standalone).
	RestConfig *rest.Config
	Log        logr.Logger
}

// Run serves until ctx is done (and ShutdownDelay has passed), then finishes the
// reviews in flight.
func Run(ctx context.Context, o Options) error {
	if err := o.limits().Validate(); err != nil {
		return err
	}
	if o.PolicyFile != "" {
		return runStandalone(ctx, o)
	}
	return runInCluster(ctx, o)
}

// tlsOptions: TLS 1.2 at least, and HTTP/1.1 only unless HTTP/2 is asked for.
func tlsOptions(enableHTTP2 bool) []func(*tls.Config) {
	return []func(*tls.Config){func(c *tls.Config) {
		c.MinVersion = tls.VersionTLS12
		if !enableHTTP2 {
			c.NextProtos = []string{"http/1.1"}
		}
	}}
}

func newWebhookServer(o Options) ctrlwebhook.Server {
	return ctrlwebhook.NewServer(ctrlwebhook.Options{
		Host: o.Host, Port: o.Port, CertDir: o.CertDir, CertName: o.CertName, KeyName: o.KeyName,
		TLSOpts: tlsOptions(o.EnableHTTP2),
	})
}

func (o Options) limits() Limits {
	l, d := o.Limits, DefaultLimits()
	if l.MaxReviews == 0 {
		l.MaxReviews = d.MaxReviews
	}
	if l.MaxReviewBytes == 0 {
		l.MaxReviewBytes = d.MaxReviewBytes
	}
	if l.Wait == 0 {
		l.Wait = d.Wait
	}
	return l
}

// registerHandlers puts the two phases on the server, behind the gate.
func registerHandlers(srv ctrlwebhook.Server, g *gate, handler func(policy.Phase) *Handler) {
	for path, phase := range map[string]policy.Phase{MutatePath: policy.Mutating, ValidatePath: policy.Validating} {
		hook := &admission.Webhook{Handler: handler(phase)}
		srv.Register(path, g.wrap(requireRequest(withRequestTimeout(hook))))
	}
}

// afterPolicy starts the server once the first policy is loaded: before it,
// the API server finds the port closed and its failure policy applies.
func afterPolicy(srv ctrlwebhook.Server, source *policysource.Source) manager.Runnable {
	return manager.RunnableFunc(func(ctx context.Context) error {
		select {
		case <-source.FirstLoad():
			return srv.Start(ctx)
		case <-ctx.Done():
			return nil
		}
	})
}

// afterDelay is done d after ctx is.
func afterDelay(ctx context.Context, d time.Duration) context.Context {
	if d <= 0 {
		return ctx
	}
	delayed, cancel := context.WithCancel(context.WithoutCancel(ctx))
	go func() {
		<-ctx.Done()
		t := time.NewTimer(d)
		defer t.Stop()
		<-t.C
		cancel()
	}()
	return delayed
}

// notStopping is a readiness check that fails once ctx is done.
func notStopping(ctx context.Context) healthz.Checker {
	return func(*http.Request) error {
		if ctx.Err() != nil {
			return errors.New("shutting down")
		}
		return nil
	}
}

// withRequestTimeout honours the API server's per-request timeout, which it sends
// as the timeout query parameter, so that work for a caller who gave up stops.
func withRequestTimeout(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if d, err := time.ParseDuration(r.URL.Query().Get("timeout")); err == nil && d > 0 {
			ctx, cancel := context.WithTimeout(r.Context(), d)
			defer cancel()
			r = r.WithContext(ctx)
		}
		next.ServeHTTP(w, r)
	})
}

// runStandalone serves a policy file without any API server: for local use, demos
// and benchmarks. Namespace labels and ConfigMaps are unknown there.
func runStandalone(ctx context.Context, o Options) error {
	m := DefaultMetrics()
	source := NewPolicySource(m, o.Log)
	data, name := config.DefaultYAML(), "builtin default policy"
	if o.PolicyFile != BuiltinPolicy {
		var err error
		if data, err = os.ReadFile(o.PolicyFile); err != nil {
			return err
		}
		name = o.PolicyFile
	}
	if _, err := source.Load(name, data); err != nil {
		return fmt.Errorf("invalid policy:\n%w", err)
	}
	srv := newWebhookServer(o)
	stopping := ctx
	ctx = afterDelay(ctx, o.ShutdownDelay)
	registerHandlers(srv, newGate(o.limits(), source.Loaded, ctx.Done(), m), func(phase policy.Phase) *Handler {
		return &Handler{Phase: phase, Policies: source, Metrics: m, Log: o.Log.WithName(string(phase))}
	})
	probes := &http.Server{Addr: o.ProbeAddr, Handler: probeMux(source.Ready, srv.StartedChecker(), notStopping(stopping)), ReadHeaderTimeout: 5 * time.Second}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return srv.Start(ctx) })
	if o.ProbeAddr != "" && o.ProbeAddr != "0" {
		g.Go(func() error { return serveUntilDone(ctx, probes) })
	}
	return g.Wait()
}

// probeMux serves /healthz, /readyz (policy loaded and TLS server answering) and
// /metrics on one plain-HTTP listener.
func probeMux(policyReady, serverStarted, notStopping healthz.Checker) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/healthz", http.StripPrefix("/healthz", &healthz.Handler{Checks: map[string]healthz.Checker{"ping": healthz.Ping}}))
	mux.Handle("/readyz", http.StripPrefix("/readyz", &healthz.Handler{Checks: map[string]healthz.Checker{
		"policy": policyReady, "webhook": serverStarted, "stopping": notStopping}}))
	mux.Handle("/metrics", promhttp.HandlerFor(ctrlmetrics.Registry, promhttp.HandlerOpts{}))
	return mux
}

func serveUntilDone(ctx context.Context, srv *http.Server) error {
	ln, err := net.Listen("tcp", srv.Addr)
	if err != nil {
		return err
	}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
