package webhook

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"

	"github.com/gpuguard/gpuguard/cel"
	"github.com/gpuguard/gpuguard/webhook/backgroundaudit"
	"github.com/gpuguard/gpuguard/webhook/hardening"
)

// Config is the whole of the webhook's configuration, grouped by concern.
// The gpuguard webhook command fills it from its flags, starting from
// DefaultConfig; Validate checks all of it at once, and its errors name the
// setting (serving.port), never a flag.
type Config struct {
	// Role splits the webhook's work between two kinds of pods: RoleServe
	// answers reviews and writes nothing of admission configuration;
	// RoleControl keeps the certificate, the CEL backstop, the pre-filter
	// and the background audit, and answers no review. RoleAll does both in
	// one process.
	Role Role

	Serving      Serving
	Policy       PolicySource
	Certificates Certificates
	// WebhookConfigurations are the webhook configurations that call this
	// webhook: managed certificates put their CA bundle in them, and the
	// pre-filter is kept on their pod webhooks.
	WebhookConfigurations WebhookConfigurations
	Backstop              Backstop
	Prefilter             Prefilter
	Hardening             Hardening
	// Audit runs the background audit (and writes OpenReports) every
	// Audit.Interval; zero: off.
	Audit         backgroundaudit.Options
	Lookups       Lookups
	Observability Observability
	Limits        Limits

	// RestConfig reaches the API server (not needed with Policy.File). Not a
	// setting: the command builds it from its kubeconfig.
	RestConfig *rest.Config
	Log        logr.Logger
}

// Serving is where and how /mutate and /validate are served.
type Serving struct {
	Host string
	Port int
	// CertDir holds CertName and KeyName, reloaded when they change.
	CertDir, CertName, KeyName string
	// EnableHTTP2 is off by default: HTTP/2 rapid-reset and stream attacks are
	// not worth the gain for admission traffic.
	EnableHTTP2 bool
	// ShutdownDelay keeps serving this long after the context is done,
	// reporting not ready, so that the Service stops sending reviews before
	// the server stops.
	ShutdownDelay time.Duration
}

// PolicySource is where the policy comes from.
type PolicySource struct {
	// File runs standalone, without an API server: a policy file, or
	// BuiltinPolicy. When empty, the policy comes from ConfigMap.
	File      string
	ConfigMap types.NamespacedName
	// Fallback puts the built-in default policy in force while the
	// ConfigMap has never held a valid one (see policysource.Reconciler).
	Fallback bool
	// UnguardedNamespaces are the namespaces the webhook configurations
	// leave out; those that do not exist are reported.
	UnguardedNamespaces []string
}

// Certificates managed by gpuguard itself (cert-controller): when Secret is
// set, a CA and serving certificate are kept in that Secret, written to
// Serving.CertDir, rotated, and the CA bundle is injected into the
// WebhookConfigurations.
type Certificates struct {
	Secret        types.NamespacedName
	ServiceName   string
	ExtraDNSNames []string
	// WriteDir writes Secret's certificate and key into Serving.CertDir
	// (which must then be writable) as soon as they change, instead of
	// waiting for the kubelet to refresh a mounted Secret.
	WriteDir bool
}

// WebhookConfigurations names gpuguard's webhook configurations.
type WebhookConfigurations struct {
	Mutating, Validating string
	// File, when set, holds the two configurations, which the webhook
	// registers itself once a replica is ready (registration.Registrar):
	// until then nothing calls it, so an install that never comes up
	// blocks nothing.
	File string
	// Owner names the ClusterRole whose deletion (helm uninstall)
	// garbage-collects the registered configurations; empty: none.
	Owner string
}

// Backstop keeps the policy's CEL backstop applied in the cluster.
type Backstop struct {
	Enabled bool
	// CEL names the backstop and the namespaces it leaves out.
	CEL cel.Options
	// Owner names the ClusterRole whose deletion garbage-collects the
	// backstop (the chart's webhook ClusterRole, which only helm uninstall
	// removes); empty leaves the backstop without an owner.
	Owner string
}

// Prefilter keeps the policy's pre-filter (cel.Prefilter) as a match
// condition on the pod webhooks named in Webhooks, of the
// WebhookConfigurations.
type Prefilter struct {
	Webhooks []string
}

// Hardening is the hardened-cluster profile.
type Hardening struct {
	// InjectVoid: InjectAlways follows the policy; InjectNever puts it in
	// force without its void injection; InjectAuto does so only while every
	// GPU node (a node with any of GPUNodeLabels) reports itself hardened
	// (wellknown.HardenedMarkLabel).
	InjectVoid    InjectVoid
	GPUNodeLabels []hardening.Label
	// EnforcerLeaseNamespace, with InjectAuto, is where the agents' node
	// enforcers hold their Leases: a GPU node whose enforcer holds a fresh
	// one counts as covered, as a hardened one does.
	EnforcerLeaseNamespace string
	// GPUDRADrivers, with InjectAuto, are the DRA drivers whose devices
	// are GPUs: a node on which one publishes a ResourceSlice is a GPU node
	// (read where the API server serves resource.k8s.io).
	GPUDRADrivers []string
}

// Lookups bound what a review reads besides its object.
type Lookups struct {
	// ConfigMapCacheTTL is how long a ConfigMap read for envFrom inspection
	// is reused.
	ConfigMapCacheTTL time.Duration
	// APIReadTimeout bounds each namespace or ConfigMap read a review
	// needs; keep it well under the webhook configurations' timeoutSeconds.
	APIReadTimeout time.Duration
}

// Observability are the listen addresses of what watches the webhook;
// empty: off.
type Observability struct {
	// MetricsAddr serves /metrics.
	MetricsAddr string
	// ProbeAddr serves /healthz and /readyz.
	ProbeAddr string
	// PprofAddr serves Go's profiles (net/http/pprof), to profile the
	// webhook under the API server's load.
	PprofAddr string
}

// DefaultConfig is the configuration the webhook command starts from: its
// flags' defaults, and the chart's unless its values say otherwise.
func DefaultConfig() Config {
	return Config{
		Role: RoleAll,
		Serving: Serving{Port: 9443, CertDir: "/tmp/k8s-webhook-server/serving-certs",
			CertName: "tls.crt", KeyName: "tls.key"},
		Policy:        PolicySource{ConfigMap: types.NamespacedName{Namespace: "gpuguard", Name: "gpuguard-policy"}, Fallback: true},
		Certificates:  Certificates{ServiceName: "gpuguard-webhook"},
		Backstop:      Backstop{CEL: cel.Options{Name: cel.DefaultName}},
		Hardening:     Hardening{InjectVoid: InjectAlways, GPUNodeLabels: DefaultGPUNodeLabels(), GPUDRADrivers: hardening.DefaultGPUDRADrivers()},
		Lookups:       Lookups{ConfigMapCacheTTL: 10 * time.Second, APIReadTimeout: 2 * time.Second},
		Observability: Observability{MetricsAddr: ":8080", ProbeAddr: ":8081"},
		Limits:        DefaultLimits(),
		Log:           logr.Discard(),
	}
}

// DefaultGPUNodeLabels tell GPU nodes by the labels NVIDIA's GPU feature
// discovery and node feature discovery put on them.
func DefaultGPUNodeLabels() []hardening.Label {
	return []hardening.Label{{Key: "nvidia.com/gpu.present", Value: "true"},
		{Key: "feature.node.kubernetes.io/pci-10de.present", Value: "true"}}
}

// FieldError is one setting Validate refuses: Field is its path in Config
// (serving.port), Detail what is wrong with it.
type FieldError struct {
	Field, Detail string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Detail }

// FieldErrors are the FieldErrors in err, as Validate returns them.
func FieldErrors(err error) []*FieldError {
	var out []*FieldError
	var walk func(error)
	walk = func(err error) {
		var fe *FieldError
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
		} else if errors.As(err, &fe) {
			out = append(out, fe)
		}
	}
	if err != nil {
		walk(err)
	}
	return out
}

// Validate checks the whole configuration: each setting, and the settings
// that only mean something together. It returns every FieldError found,
// joined, or nil.
func (c Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{field, fmt.Sprintf(format, args...)})
	}
	standalone := c.Policy.File != ""

	switch c.Role {
	case RoleAll:
	case RoleServe:
		if len(c.Prefilter.Webhooks) > 0 || c.Audit.Interval > 0 {
			bad("role", "serve writes nothing to the cluster: prefilter.webhooks and audit.interval belong to the control role")
		}
	case RoleControl:
		if standalone {
			bad("role", "control keeps objects in a cluster and needs an API server; it cannot run with policy.file")
		}
	default:
		bad("role", "%q: want %s", c.Role, oneOf(Roles()))
	}

	if c.Serving.Port < 1 || c.Serving.Port > 65535 {
		bad("serving.port", "%d: must be 1-65535", c.Serving.Port)
	}
	if c.Serving.Host != "" && net.ParseIP(c.Serving.Host) == nil && !validHostname(c.Serving.Host) {
		bad("serving.host", "%q: want an IP address or a host name", c.Serving.Host)
	}
	for field, v := range map[string]string{"serving.certDir": c.Serving.CertDir, "serving.certName": c.Serving.CertName, "serving.keyName": c.Serving.KeyName} {
		if v == "" {
			bad(field, "must be set")
		}
	}
	if c.Serving.ShutdownDelay < 0 {
		bad("serving.shutdownDelay", "%s: must not be negative", c.Serving.ShutdownDelay)
	}

	if !standalone && (c.Policy.ConfigMap.Namespace == "" || c.Policy.ConfigMap.Name == "") {
		bad("policy.configMap", "NAMESPACE/NAME is required without policy.file")
	}

	if c.Certificates.WriteDir && c.Certificates.Secret.Name == "" {
		bad("certificates.writeDir", "writes the certificates of certificates.secret; name the Secret")
	}
	if c.Certificates.Secret.Name != "" && c.Certificates.Secret.Namespace == "" {
		bad("certificates.secret", "want NAMESPACE/NAME")
	}

	if c.Backstop.Enabled && standalone {
		bad("backstop.enabled", "needs an API server; it cannot run with policy.file")
	}
	if c.Backstop.CEL.KAIGuardOnly && !c.Backstop.Enabled {
		bad("backstop.cel.kaiGuardOnly", "narrows what the backstop applies: it needs backstop.enabled")
	}
	if c.Backstop.Owner != "" && !c.Backstop.Enabled {
		bad("backstop.owner", "names the owner of the CEL backstop: it needs backstop.enabled")
	}

	if len(c.Prefilter.Webhooks) > 0 && (standalone || c.WebhookConfigurations.Mutating == "" && c.WebhookConfigurations.Validating == "") {
		bad("prefilter.webhooks", "needs an API server and the configurations that hold the webhooks (webhookConfigurations.mutating, webhookConfigurations.validating)")
	}

	if w := c.WebhookConfigurations; w.File != "" {
		switch {
		case standalone:
			bad("webhookConfigurations.file", "registers the webhook configurations and needs an API server; it cannot run with policy.file")
		case !c.Role.applies():
			bad("webhookConfigurations.file", "serve writes nothing of admission configuration: registering belongs to the control role")
		case w.Mutating == "" || w.Validating == "":
			bad("webhookConfigurations.file", "name the configurations it may hold (webhookConfigurations.mutating and webhookConfigurations.validating)")
		case c.Certificates.ServiceName == "":
			bad("webhookConfigurations.file", "waits for a ready endpoint of the webhook's Service: set certificates.serviceName")
		}
	}
	if c.WebhookConfigurations.Owner != "" && c.WebhookConfigurations.File == "" {
		bad("webhookConfigurations.owner", "names the owner of the registered configurations: it needs webhookConfigurations.file")
	}

	switch c.Hardening.InjectVoid {
	case InjectAlways, InjectNever:
	case InjectAuto:
		if standalone {
			bad("hardening.injectVoid", "auto follows the GPU nodes' reports and needs an API server; it cannot run with policy.file")
		}
		if len(c.Hardening.GPUNodeLabels) == 0 {
			bad("hardening.gpuNodeLabels", "hardening.injectVoid=auto needs at least one label to tell GPU nodes")
		}
	default:
		bad("hardening.injectVoid", "%q: want %s", c.Hardening.InjectVoid, oneOf(InjectVoids()))
	}
	if c.Hardening.EnforcerLeaseNamespace != "" && c.Hardening.InjectVoid != InjectAuto {
		bad("hardening.enforcerLeaseNamespace", "follows the agents' Leases for hardening.injectVoid=auto; it means nothing without it")
	}
	for _, l := range c.Hardening.GPUNodeLabels {
		if l.Key == "" {
			bad("hardening.gpuNodeLabels", "a label with no key")
		}
	}
	for _, d := range c.Hardening.GPUDRADrivers {
		if errs := validation.IsDNS1123Subdomain(d); len(errs) > 0 {
			bad("hardening.gpuDRADrivers", "%q is not a DRA driver name (a DNS subdomain): %s", d, strings.Join(errs, "; "))
		}
	}

	switch a := c.Audit; {
	case a.Interval < 0 || (a.Interval > 0 && a.Interval < MinAuditInterval):
		bad("audit.interval", "%s: use 0 (off) or at least %s", a.Interval, MinAuditInterval)
	case a.Interval > 0 && standalone:
		bad("audit.interval", "needs an API server; it cannot run with policy.file")
	case a.Interval == 0 && a.Reports:
		bad("audit.reports", "writes the background audit's results; set audit.interval")
	}

	if c.Lookups.ConfigMapCacheTTL < 0 {
		bad("lookups.configMapCacheTTL", "%s: must not be negative", c.Lookups.ConfigMapCacheTTL)
	}
	if c.Lookups.APIReadTimeout <= 0 {
		bad("lookups.apiReadTimeout", "%s: must be positive", c.Lookups.APIReadTimeout)
	}

	errs = append(errs, c.Limits.validate()...)
	return errors.Join(errs...)
}

// MinAuditInterval is the shortest background audit interval: each run
// lists every pod and pod controller in the cluster.
const MinAuditInterval = 10 * time.Second

func oneOf[T ~string](vs []T) string {
	s := ""
	for i, v := range vs {
		switch {
		case i == 0:
		case i == len(vs)-1:
			s += " or "
		default:
			s += ", "
		}
		s += string(v)
	}
	return s
}

// validHostname: letters, digits, '-' and '.', as a listen address's host.
func validHostname(h string) bool {
	if len(h) > 253 {
		return false
	}
	for _, r := range h {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.') {
			return false
		}
	}
	return true
}
