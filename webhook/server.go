package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	openreports "github.com/openreports/reports-api/apis/openreports.io/v1alpha1"
	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/policy"
	"github.com/gpuguard/gpuguard/webhook/hardening"
	"github.com/gpuguard/gpuguard/webhook/policysource"
	"github.com/gpuguard/gpuguard/webhook/servingcert"
)

// Paths of the admission endpoints.
const (
	MutatePath   = "/mutate"
	ValidatePath = "/validate"
)

// BuiltinPolicy, as Config.Policy.File, selects the policy embedded in the binary.
const BuiltinPolicy = "builtin"

// Run serves until ctx is done (and Serving.ShutdownDelay has passed), then
// finishes the reviews in flight. Both modes run through one controller-runtime manager,
// which serves the probes and metrics: in the cluster, with the policy
// ConfigMap watched and what reviews read cached; standalone, with a policy
// file and nothing read from any API server.
func Run(ctx context.Context, o Config) error {
	if err := o.Validate(); err != nil {
		return fmt.Errorf("invalid webhook configuration: %w", err)
	}
	if o.Policy.File == "" && o.RestConfig == nil {
		return errors.New("no API server configuration: the webhook needs one unless it runs with policy.file")
	}
	mgr, err := newManager(o)
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	m := DefaultMetrics()
	if err := registerCertExpiry(o.Serving.CertDir, o.Serving.CertName); err != nil {
		return err
	}
	source := NewPolicySource(m, o.Log.WithName("policy"))
	if !o.Backstop.Enabled {
		source.SetRequirement(requireNoKAIFractions)
	}
	if o.Hardening.InjectVoid == InjectNever {
		_, _ = source.SetInjectionOff(true) // nothing is loaded yet: it cannot fail
		m.InjectionOff.Set(1)
	}
	in := reviewInputs{}
	if o.Policy.File != "" {
		err = loadPolicyFile(source, o.Policy.File)
	} else {
		in, err = watchCluster(mgr, o, source, m)
	}
	if err != nil {
		return err
	}
	if o.Role == RoleControl {
		return runController(ctx, mgr, o, source, in.registered)
	}
	serveCtx := afterDelay(ctx, o.Serving.ShutdownDelay)
	srv := newReviewServer(o.Serving, o.Limits, o.Log.WithName("server"))
	g := newGate(o.Limits, source.Loaded, serveCtx.Done(), m)
	g.draining = ctx.Done()
	registerHandlers(srv, g, func(phase policy.Phase) *Handler {
		return &Handler{Phase: phase, Policies: source, Namespaces: in.namespaces, ConfigMaps: in.configMaps,
			Nodes: in.nodes, Metrics: m, Log: o.Log.WithName(string(phase))}
	})
	readiness := map[string]healthz.Checker{"policy": source.Ready, "webhook": srv.StartedChecker(), "stopping": notStopping(ctx)}
	if in.ready != nil {
		readiness["namespaces"] = in.ready
	}
	if err := addProbes(mgr, readiness); err != nil {
		return err
	}
	switch {
	case o.Certificates.Secret.Name == "":
		err = mgr.Add(afterPolicy(srv, source))
	case o.Role == RoleServe:
		// The controller issues and rotates the certificate; this pod
		// only reads the Secret.
		err = servingcert.Follow(mgr, o.servingCert(), afterPolicy(srv, source), o.Log)
	default:
		err = servingcert.Add(mgr, o.servingCert(), afterPolicy(srv, source), o.Log)
	}
	if err != nil {
		return err
	}
	return mgr.Start(serveCtx)
}

// runController runs RoleControl: the policy, and what the webhook keeps in
// the cluster, with no review server. Ready once a policy is loaded and the
// webhook configurations, where it registers them, are registered (a
// process that also serves reviews cannot wait for that: registration
// waits for a ready replica).
func runController(ctx context.Context, mgr manager.Manager, o Config, source *policysource.Source, registered healthz.Checker) error {
	readiness := map[string]healthz.Checker{"policy": source.Ready, "stopping": notStopping(ctx)}
	if registered != nil {
		readiness["webhook-configurations"] = registered
	}
	if err := addProbes(mgr, readiness); err != nil {
		return err
	}
	if o.Certificates.Secret.Name != "" {
		idle := manager.RunnableFunc(func(ctx context.Context) error { <-ctx.Done(); return nil })
		if err := servingcert.Add(mgr, o.servingCert(), idle, o.Log); err != nil {
			return err
		}
	}
	return mgr.Start(ctx)
}

// Role is what a webhook process does.
type Role string

// The roles.
const (
	RoleAll     Role = "all"
	RoleServe   Role = "serve"
	RoleControl Role = "control"
)

// Roles are the roles, for a command line's choices.
func Roles() []Role { return []Role{RoleAll, RoleServe, RoleControl} }

// applies says whether the role writes what the webhook keeps in the
// cluster (the CEL backstop, the pre-filter, the background audit).
func (r Role) applies() bool { return r != RoleServe }

// InjectVoid is the hardened-cluster profile (Config.Hardening.InjectVoid).
type InjectVoid string

// The profiles.
const (
	InjectAlways InjectVoid = "always"
	InjectAuto   InjectVoid = "auto"
	InjectNever  InjectVoid = "never"
)

// InjectVoids are the profiles, for a command line's choices.
func InjectVoids() []InjectVoid { return []InjectVoid{InjectAlways, InjectAuto, InjectNever} }

// standaloneConfig stands in for an API server in standalone mode. The
// manager needs one to be built, but nothing is read or watched through it:
// a request that were made would fail to resolve the host, not reach a cluster.
var standaloneConfig = &rest.Config{Host: "https://gpuguard-standalone.invalid"}

// newManager makes the manager with probes and metrics on their addresses;
// in the cluster its cache watches only the policy ConfigMap (other
// ConfigMaps are read on demand) and namespaces' metadata.
func newManager(o Config) (manager.Manager, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := openreports.Install(scheme); err != nil {
		return nil, err
	}
	opts := manager.Options{
		Scheme:                 scheme,
		Logger:                 o.Log,
		Metrics:                metricsserver.Options{BindAddress: orOff(o.Observability.MetricsAddr)},
		HealthProbeBindAddress: orOff(o.Observability.ProbeAddr),
		PprofBindAddress:       orOff(o.Observability.PprofAddr),
	}
	if o.Policy.File != "" {
		return ctrl.NewManager(standaloneConfig, opts)
	}
	opts.Cache = cache.Options{ByObject: map[client.Object]cache.ByObject{
		&corev1.ConfigMap{}: {
			Namespaces: map[string]cache.Config{o.Policy.ConfigMap.Namespace: {}},
			Field:      fields.OneTermEqualSelector("metadata.name", o.Policy.ConfigMap.Name),
		},
	}}
	if o.Hardening.EnforcerLeaseNamespace != "" {
		// The node enforcers' Leases, in their namespace only: the webhook
		// may not list Leases anywhere else.
		opts.Cache.ByObject[&coordinationv1.Lease{}] = cache.ByObject{Namespaces: map[string]cache.Config{o.Hardening.EnforcerLeaseNamespace: {}}}
	}
	if o.Hardening.InjectVoid == InjectAuto {
		// DRA ResourceSlices, watched in the version served (which only
		// discovery tells, so not a ByObject entry, which must name a served
		// one), are held as their driver and nodes, not every device's
		// attributes. Other objects pass unchanged.
		opts.Cache.DefaultTransform = hardening.TrimSlice
	}
	return ctrl.NewManager(o.RestConfig, opts)
}

// orOff is a listen address, "0" (off) when empty: controller-runtime
// would take "" as its default port.
func orOff(addr string) string {
	if addr == "" {
		return "0"
	}
	return addr
}

// addProbes serves /healthz and /readyz (every check in readiness) on the
// manager's probe address.
func addProbes(mgr manager.Manager, readiness map[string]healthz.Checker) error {
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	for name, check := range readiness {
		if err := mgr.AddReadyzCheck(name, check); err != nil {
			return err
		}
	}
	return nil
}

// loadPolicyFile loads a policy file, or the built-in policy, into source.
func loadPolicyFile(source *policysource.Source, file string) error {
	data, name := config.DefaultYAML(), "builtin default policy"
	if file != BuiltinPolicy {
		var err error
		if data, err = os.ReadFile(file); err != nil {
			return err
		}
		name = file
	}
	if _, err := source.Load(name, data); err != nil {
		return fmt.Errorf("invalid policy:\n%w", err)
	}
	return nil
}

// servingCert are the options of gpuguard-managed certificates.
func (o Config) servingCert() servingcert.Options {
	return servingcert.Options{Secret: o.Certificates.Secret, Dir: o.Serving.CertDir, CertName: o.Serving.CertName, KeyName: o.Serving.KeyName,
		ServiceName: o.Certificates.ServiceName, ExtraDNSNames: o.Certificates.ExtraDNSNames,
		MutatingConfig: o.WebhookConfigurations.Mutating, ValidatingConfig: o.WebhookConfigurations.Validating, WriteDir: o.Certificates.WriteDir}
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

// registerHandlers puts the two phases on the server, behind the gate.
func registerHandlers(srv interface{ Register(string, http.Handler) }, g *gate, handler func(policy.Phase) *Handler) {
	for path, phase := range map[string]policy.Phase{MutatePath: policy.Mutating, ValidatePath: policy.Validating} {
		hook := &admission.Webhook{Handler: handler(phase)}
		srv.Register(path, g.wrap(requireRequest(withRequestTimeout(hook))))
	}
}

// afterPolicy starts the server once the first policy is loaded: before it,
// the API server finds the port closed and its failure policy applies.
func afterPolicy(srv manager.Runnable, source *policysource.Source) manager.Runnable {
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

// registerCertExpiry reports the serving certificate's expiry; a second
// registration (tests run the server more than once) keeps the first.
func registerCertExpiry(dir, name string) error {
	err := ctrlmetrics.Registry.Register(servingcert.NewExpiryCollector(dir, name))
	if are := (prometheus.AlreadyRegisteredError{}); err != nil && !errors.As(err, &are) {
		return fmt.Errorf("registering the certificate expiry metric: %w", err)
	}
	return nil
}

// ErrKAIFractionsNeedGuard: a policy accepts KAI's fractions, but this
// webhook applies no backstop, so nothing keeps tenants from writing the
// ConfigMaps a fraction container reads its GPUs from.
var ErrKAIFractionsNeedGuard = errors.New("integrations.kaiScheduler.fractions: true needs the KAI ConfigMap guard, which this webhook applies only with backstop.enabled (the chart's backstop.enabled, on Kubernetes 1.30 or later); without it any tenant could write NVIDIA_VISIBLE_DEVICES=all into the ConfigMap a fraction container reads")

// requireNoKAIFractions refuses a policy with KAI fractions on where no
// guard is applied.
func requireNoKAIFractions(p *config.Policy) error {
	if p.Spec.Integrations.KAIScheduler.Fractions {
		return ErrKAIFractionsNeedGuard
	}
	return nil
}
