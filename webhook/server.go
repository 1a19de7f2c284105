package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/go-logr/logr"
	openreports "github.com/openreports/reports-api/apis/openreports.io/v1alpha1"
	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/gpuguard/gpuguard/cel"
	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/policy"
	"github.com/gpuguard/gpuguard/webhook/backgroundaudit"
	"github.com/gpuguard/gpuguard/webhook/hardening"
	"github.com/gpuguard/gpuguard/webhook/policysource"
	"github.com/gpuguard/gpuguard/webhook/servingcert"
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
	// PolicyFallback puts the built-in default policy in force while the
	// ConfigMap has never held a valid one (see policysource.Reconciler).
	PolicyFallback bool

	MetricsAddr, ProbeAddr string
	// PprofAddr serves Go's profiles (net/http/pprof), to profile the webhook
	// under the API server's load; empty: off.
	PprofAddr string
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

	// UnguardedNamespaces are the namespaces the webhook configurations
	// leave out; those that do not exist are reported.
	UnguardedNamespaces []string

	// CELBackstop keeps the policy's CEL backstop applied in the cluster, named
	// CELBackstop.Name and leaving out CELBackstop.ExcludedNamespaces.
	CELBackstop *cel.Options
	// BackstopOwner names the ClusterRole whose deletion garbage-collects the
	// backstop (the chart's webhook ClusterRole, which only helm uninstall
	// removes); empty leaves the backstop without an owner.
	BackstopOwner string

	// PrefilterWebhooks names the pod webhooks, in MutatingConfig and
	// ValidatingConfig, that get the pre-filter as a match condition
	// (cel.Prefilter), kept in step with the policy.
	PrefilterWebhooks []string

	// InjectVoid is the hardened-cluster profile: InjectAlways follows the
	// policy; InjectNever puts it in force without its void injection;
	// InjectAuto does so only while every GPU node (a node with any of
	// GPUNodeLabels) reports itself hardened (wellknown.HardenedMarkLabel).
	InjectVoid    InjectVoid
	GPUNodeLabels []hardening.Label
	// EnforcerLeaseNamespace, with InjectAuto, is where the agents' node
	// enforcers hold their Leases: a GPU node whose enforcer holds a fresh
	// one counts as covered, as a hardened one does.
	EnforcerLeaseNamespace string

	// Audit, when set, runs the background audit (and writes OpenReports).
	Audit *backgroundaudit.Options

	// Limits bound the reviews in flight; zero values take DefaultLimits.
	Limits Limits
	// ShutdownDelay keeps serving this long after ctx is done, reporting not
	// ready, so that the Service stops sending reviews before the server stops.
	ShutdownDelay time.Duration
	// APIReadTimeout bounds each namespace or ConfigMap read a review needs;
	// keep it well under the webhook configurations' timeoutSeconds.
	APIReadTimeout time.Duration

	// Role splits the webhook's work between two kinds of pods: RoleServe
	// answers reviews and writes nothing of admission configuration;
	// RoleControl keeps the certificate, the CEL backstop, the pre-filter
	// and the background audit, and answers no review. RoleAll (the
	// default) does both in one process.
	Role Role

	// RestConfig reaches the API server (not needed standalone).
	RestConfig *rest.Config
	Log        logr.Logger
}

// Run serves until ctx is done (and ShutdownDelay has passed), then finishes the
// reviews in flight. Both modes run through one controller-runtime manager,
// which serves the probes and metrics: in the cluster, with the policy
// ConfigMap watched and what reviews read cached; standalone, with a policy
// file and nothing read from any API server.
func Run(ctx context.Context, o Options) error {
	if err := o.validate(); err != nil {
		return err
	}
	mgr, err := newManager(o)
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	m := DefaultMetrics()
	if err := registerCertExpiry(o.CertDir, o.CertName); err != nil {
		return err
	}
	source := NewPolicySource(m, o.Log.WithName("policy"))
	if o.CELBackstop == nil {
		source.SetRequirement(requireNoKAIFractions)
	}
	if o.InjectVoid == InjectNever {
		_, _ = source.SetInjectionOff(true) // nothing is loaded yet: it cannot fail
		m.InjectionOff.Set(1)
	}
	in := reviewInputs{}
	if o.PolicyFile != "" {
		err = loadPolicyFile(source, o.PolicyFile)
	} else {
		in, err = watchCluster(mgr, o, source, m)
	}
	if err != nil {
		return err
	}
	if o.Role == RoleControl {
		return runController(ctx, mgr, o, source)
	}
	serveCtx := afterDelay(ctx, o.ShutdownDelay)
	srv := newWebhookServer(o)
	g := newGate(o.limits(), source.Loaded, serveCtx.Done(), m)
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
	case o.CertSecret.Name == "":
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
// the cluster, with no review server. Ready once a policy is loaded.
func runController(ctx context.Context, mgr manager.Manager, o Options, source *policysource.Source) error {
	if err := addProbes(mgr, map[string]healthz.Checker{"policy": source.Ready, "stopping": notStopping(ctx)}); err != nil {
		return err
	}
	if o.CertSecret.Name != "" {
		idle := manager.RunnableFunc(func(ctx context.Context) error { <-ctx.Done(); return nil })
		if err := servingcert.Add(mgr, o.servingCert(), idle, o.Log); err != nil {
			return err
		}
	}
	return mgr.Start(ctx)
}

// Role is what a webhook process does (--role).
type Role string

// The roles.
const (
	RoleAll     Role = "all"
	RoleServe   Role = "serve"
	RoleControl Role = "control"
)

// applies says whether the role writes what the webhook keeps in the
// cluster (the CEL backstop, the pre-filter, the background audit).
func (r Role) applies() bool { return r != RoleServe }

func (o Options) validate() error {
	if err := o.limits().Validate(); err != nil {
		return err
	}
	if err := o.validateRole(); err != nil {
		return err
	}
	if o.EnforcerLeaseNamespace != "" && o.InjectVoid != InjectAuto {
		return errors.New("--enforcer-lease-namespace follows the agents' Leases for --inject-void=auto; it means nothing without it")
	}
	switch o.InjectVoid {
	case "", InjectAlways, InjectNever:
	case InjectAuto:
		if o.PolicyFile != "" {
			return errors.New("--inject-void=auto follows the GPU nodes' reports and needs an API server; it cannot run with --policy-file")
		}
		if len(o.GPUNodeLabels) == 0 {
			return errors.New("--inject-void=auto needs at least one --gpu-node-label to tell GPU nodes")
		}
	default:
		return fmt.Errorf("--inject-void %q: want always, auto or never", o.InjectVoid)
	}
	if o.PolicyFile != "" {
		return nil
	}
	if o.PolicyConfigMap.Name == "" || o.PolicyConfigMap.Namespace == "" {
		return errors.New("--policy-configmap NAMESPACE/NAME is required without --policy-file")
	}
	if o.RestConfig == nil {
		return errors.New("no API server configuration: give --kubeconfig, run in a cluster, or use --policy-file")
	}
	return nil
}

// validateRole refuses settings the role cannot carry out.
func (o Options) validateRole() error {
	switch o.Role {
	case "", RoleAll:
	case RoleServe:
		if len(o.PrefilterWebhooks) > 0 || o.Audit != nil {
			return errors.New("--role=serve writes nothing to the cluster: --prefilter-webhook and --audit-interval belong to the --role=control process")
		}
	case RoleControl:
		if o.PolicyFile != "" {
			return errors.New("--role=control keeps objects in a cluster and needs an API server; it cannot run with --policy-file")
		}
	default:
		return fmt.Errorf("--role %q: want all, serve or control", o.Role)
	}
	return nil
}

// InjectVoid is the hardened-cluster profile (--inject-void).
type InjectVoid string

// The profiles.
const (
	InjectAlways InjectVoid = "always"
	InjectAuto   InjectVoid = "auto"
	InjectNever  InjectVoid = "never"
)

// standaloneConfig stands in for an API server in standalone mode. The
// manager needs one to be built, but nothing is read or watched through it:
// a request that were made would fail to resolve the host, not reach a cluster.
var standaloneConfig = &rest.Config{Host: "https://gpuguard-standalone.invalid"}

// newManager makes the manager with probes and metrics on their addresses;
// in the cluster its cache watches only the policy ConfigMap (other
// ConfigMaps are read on demand) and namespaces' metadata.
func newManager(o Options) (manager.Manager, error) {
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
		Metrics:                metricsserver.Options{BindAddress: orOff(o.MetricsAddr)},
		HealthProbeBindAddress: orOff(o.ProbeAddr),
		PprofBindAddress:       orOff(o.PprofAddr),
	}
	if o.PolicyFile != "" {
		return ctrl.NewManager(standaloneConfig, opts)
	}
	opts.Cache = cache.Options{ByObject: map[client.Object]cache.ByObject{
		&corev1.ConfigMap{}: {
			Namespaces: map[string]cache.Config{o.PolicyConfigMap.Namespace: {}},
			Field:      fields.OneTermEqualSelector("metadata.name", o.PolicyConfigMap.Name),
		},
	}}
	if o.EnforcerLeaseNamespace != "" {
		// The node enforcers' Leases, in their namespace only: the webhook
		// may not list Leases anywhere else.
		opts.Cache.ByObject[&coordinationv1.Lease{}] = cache.ByObject{Namespaces: map[string]cache.Config{o.EnforcerLeaseNamespace: {}}}
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
func (o Options) servingCert() servingcert.Options {
	return servingcert.Options{Secret: o.CertSecret, Dir: o.CertDir, CertName: o.CertName, KeyName: o.KeyName,
		ServiceName: o.ServiceName, ExtraDNSNames: o.ExtraDNSNames,
		MutatingConfig: o.MutatingConfig, ValidatingConfig: o.ValidatingConfig, WriteDir: o.WriteCertDir}
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
	if l.BodyRead == 0 {
		l.BodyRead = d.BodyRead
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
var ErrKAIFractionsNeedGuard = errors.New("integrations.kaiScheduler.fractions: true needs the KAI ConfigMap guard, which this webhook applies only with --cel-backstop (chart: backstop.enabled on Kubernetes 1.30 or later); without it any tenant could write NVIDIA_VISIBLE_DEVICES=all into the ConfigMap a fraction container reads")

// requireNoKAIFractions refuses a policy with KAI fractions on where no
// guard is applied.
func requireNoKAIFractions(p *config.Policy) error {
	if p.Spec.Integrations.KAIScheduler.Fractions {
		return ErrKAIFractionsNeedGuard
	}
	return nil
}
