package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"

	"github.com/gpuguard/gpuguard/internal/kubeconfig"
	"github.com/gpuguard/gpuguard/internal/logging"
	"github.com/gpuguard/gpuguard/webhook"
)

// webhookFlags fill a webhook.Config from the command line: each flag sets
// one setting, the typed ones checking their value as it is parsed; the
// settings together are webhook.Config.Validate's.
type webhookFlags struct {
	cfg     webhook.Config
	kube    kubeconfig.Flags
	logging logging.Options
}

// settingFlags name the flag that sets each of webhook.Config's settings,
// so that a setting Validate refuses is reported by its flag as well.
var settingFlags = map[string]string{
	"role":                             "role",
	"serving.host":                     "host",
	"serving.port":                     "port",
	"serving.certDir":                  "cert-dir",
	"serving.certName":                 "cert-name",
	"serving.keyName":                  "key-name",
	"serving.shutdownDelay":            "shutdown-delay",
	"policy.file":                      "policy-file",
	"policy.configMap":                 "policy-configmap",
	"certificates.secret":              "cert-secret",
	"certificates.writeDir":            "write-cert-dir",
	"backstop.enabled":                 "cel-backstop",
	"backstop.cel.kaiGuardOnly":        "cel-backstop-kai-guard-only",
	"backstop.owner":                   "cel-backstop-owner",
	"prefilter.webhooks":               "prefilter-webhook",
	"webhookConfigurations.file":       "webhook-configurations-file",
	"webhookConfigurations.owner":      "webhook-configurations-owner",
	"hardening.injectVoid":             "inject-void",
	"hardening.gpuNodeLabels":          "gpu-node-label",
	"hardening.enforcerLeaseNamespace": "enforcer-lease-namespace",
	"hardening.gpuDRADrivers":          "gpu-dra-driver",
	"audit.interval":                   "audit-interval",
	"audit.reports":                    "audit-reports",
	"lookups.configMapCacheTTL":        "configmap-cache-ttl",
	"lookups.apiReadTimeout":           "api-read-timeout",
	"limits.maxReviews":                "max-inflight-reviews",
	"limits.maxReviewBytes":            "max-inflight-review-bytes",
	"limits.wait":                      "overload-wait",
	"limits.maxHeaderBytes":            "max-header-bytes",
	"limits.readHeaderTimeout":         "read-header-timeout",
	"limits.idleTimeout":               "idle-timeout",
	"limits.maxConnections":            "max-connections",
}

func newWebhookCommand() *cobra.Command {
	f := &webhookFlags{cfg: webhook.DefaultConfig()}
	cmd := &cobra.Command{
		Use:   "webhook",
		Short: "Serve the admission webhook (/mutate and /validate over TLS)",
		Long: `webhook serves gpuguard's policy to the Kubernetes API server.

The policy comes from a ConfigMap (--policy-configmap NAMESPACE/NAME, key
policy.yaml), watched and applied within seconds of an edit; an edit that does not
parse keeps the last good policy, and until the ConfigMap has held a valid one the
built-in default policy stands in (--policy-fallback). --policy-file FILE runs without any API server,
and --policy-file alone uses the built-in default policy.

Certificates come from --cert-dir (reloaded when the files change), or are managed
by gpuguard itself with --cert-secret: a CA and serving certificate kept in that
Secret, rotated, with the CA bundle written into the named webhook configurations;
with --write-cert-dir the webhook also writes them into --cert-dir itself, so a
new replica is ready in seconds rather than when the kubelet next refreshes a
mounted Secret.

Each flag sets one setting of the webhook's configuration; a value that is not
of the flag's type (a port, a duration, one of a set of words, NAMESPACE/NAME,
KEY=VALUE) fails as the flags are parsed, and settings that conflict fail
before anything starts, each naming its flag and setting.`,
		Example: `  gpuguard webhook --policy-file --cert-dir ./certs
  gpuguard webhook --policy-configmap gpuguard/gpuguard-policy \
    --cert-secret gpuguard/gpuguard-webhook-tls --service-name gpuguard-webhook \
    --mutating-webhook-configuration gpuguard --validating-webhook-configuration gpuguard`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			// "--policy-file FILE" with a space: the value arrives as an argument.
			if len(args) == 1 {
				if f.cfg.Policy.File != webhook.BuiltinPolicy {
					return fmt.Errorf("unexpected argument %q", args[0])
				}
				f.cfg.Policy.File = args[0]
			}
			return f.run(cmd)
		},
	}
	f.addFlags(cmd.Flags())
	return cmd
}

func (f *webhookFlags) addFlags(fl *pflag.FlagSet) {
	c := &f.cfg
	fl.Var(newEnumValue(&c.Role, webhook.Roles()), "role", "all: answer reviews and keep what the webhook keeps in the cluster; serve: answer reviews and write nothing of admission configuration (certificates read from --cert-secret); control: keep the certificate, the CEL backstop, the pre-filter and the background audit, and answer no review")

	fl.StringVar(&c.Serving.Host, "host", c.Serving.Host, "address to listen on (default: all)")
	fl.Var(portValue{&c.Serving.Port}, "port", "HTTPS port of /mutate and /validate")
	fl.StringVar(&c.Serving.CertDir, "cert-dir", c.Serving.CertDir, "directory with the serving certificate and key")
	fl.StringVar(&c.Serving.CertName, "cert-name", c.Serving.CertName, "certificate file name in --cert-dir")
	fl.StringVar(&c.Serving.KeyName, "key-name", c.Serving.KeyName, "key file name in --cert-dir")
	fl.BoolVar(&c.Serving.EnableHTTP2, "enable-http2", c.Serving.EnableHTTP2, "serve HTTP/2 as well as HTTP/1.1")
	fl.Var(durationValue{&c.Serving.ShutdownDelay, 0}, "shutdown-delay", "after SIGTERM, keep serving this long while reporting not ready, each answer closing its connection, so that the Service and the API server stop sending reviews here first")

	fl.StringVar(&c.Policy.File, "policy-file", c.Policy.File, "run standalone with this policy file; alone, the built-in policy")
	fl.Lookup("policy-file").NoOptDefVal = webhook.BuiltinPolicy
	fl.Var(namespacedNameValue{p: &c.Policy.ConfigMap}, "policy-configmap", "NAMESPACE/NAME of the policy ConfigMap")
	fl.BoolVar(&c.Policy.Fallback, "policy-fallback", c.Policy.Fallback, "while the policy ConfigMap has never held a valid policy, enforce the built-in default policy and stay ready (a Warning Event PolicyFallback and gpuguard_policy_fallback say so); false: stay unready, so the failure policy applies")
	fl.StringArrayVar(&c.Policy.UnguardedNamespaces, "unguarded-namespace", nil, "a namespace the webhook configurations leave out (repeatable; the chart passes its excluded namespaces): one that does not exist is reported, since whoever creates it gets an unguarded namespace")

	fl.StringVar(&c.Observability.MetricsAddr, "metrics-bind-address", c.Observability.MetricsAddr, "address of /metrics (0 to disable)")
	fl.StringVar(&c.Observability.ProbeAddr, "health-probe-bind-address", c.Observability.ProbeAddr, "address of /healthz and /readyz")
	fl.StringVar(&c.Observability.PprofAddr, "pprof-bind-address", c.Observability.PprofAddr, "address of Go's profiles (/debug/pprof/), for profiling under load; empty: off")

	fl.Var(durationValue{&c.Lookups.ConfigMapCacheTTL, 0}, "configmap-cache-ttl", "how long a ConfigMap read for envFrom inspection is reused")
	fl.Var(durationValue{&c.Lookups.APIReadTimeout, time.Millisecond}, "api-read-timeout", "bound on each namespace or ConfigMap read a review needs; keep it under the webhooks' timeoutSeconds")

	fl.Var(namespacedNameValue{p: &c.Certificates.Secret, optional: true}, "cert-secret", "NAMESPACE/NAME: manage certificates in this Secret (cert-controller)")
	fl.StringVar(&c.Certificates.ServiceName, "service-name", c.Certificates.ServiceName, "the webhook Service, for the certificate's DNS name")
	fl.StringSliceVar(&c.Certificates.ExtraDNSNames, "extra-dns-names", nil, "more DNS names for the serving certificate (e.g. localhost)")
	fl.BoolVar(&c.Certificates.WriteDir, "write-cert-dir", false, "with --cert-secret: write the Secret's certificate and key into --cert-dir (writable, e.g. an emptyDir) as they change, rather than wait for the kubelet to refresh a mounted Secret (a minute or more)")
	fl.StringVar(&c.WebhookConfigurations.Mutating, "mutating-webhook-configuration", "", "MutatingWebhookConfiguration to inject the CA bundle into")
	fl.StringVar(&c.WebhookConfigurations.Validating, "validating-webhook-configuration", "", "ValidatingWebhookConfiguration to inject the CA bundle into (self-managed certificates)")

	fl.StringVar(&c.WebhookConfigurations.File, "webhook-configurations-file", "", "YAML file with the two webhook configurations (named by --mutating-webhook-configuration and --validating-webhook-configuration): registered by the webhook itself, server-side apply, once its Service (--service-name, in the policy ConfigMap's namespace) has a ready endpoint, so an install that never comes up blocks nothing")
	fl.StringVar(&c.WebhookConfigurations.Owner, "webhook-configurations-owner", "", "ClusterRole that owns the registered webhook configurations: deleting it (helm uninstall) garbage-collects them. Empty: no owner")

	fl.BoolVar(&c.Backstop.Enabled, "cel-backstop", false, "keep the policy's CEL backstop (ValidatingAdmissionPolicy and MutatingAdmissionPolicy) applied in the cluster (with --role=serve: another process applies it)")
	fl.StringVar(&c.Backstop.CEL.Name, "cel-backstop-name", c.Backstop.CEL.Name, "name of the CEL backstop's policies and bindings")
	fl.BoolVar(&c.Backstop.CEL.KAIGuardOnly, "cel-backstop-kai-guard-only", false, "with --cel-backstop, apply only the KAI ConfigMap guard (a ValidatingAdmissionPolicy, Kubernetes 1.30 or later) while the policy turns KAI fractions on: for API servers without MutatingAdmissionPolicy, where the rest of the backstop cannot run")
	fl.StringVar(&c.Backstop.Owner, "cel-backstop-owner", "", "ClusterRole that owns the CEL backstop: deleting it (helm uninstall) garbage-collects the backstop; deleting the webhook configurations does not. Empty: the backstop has no owner")
	fl.StringArrayVar(&c.Backstop.CEL.ExcludedNamespaces, "cel-backstop-exclude-namespace", nil, "namespace the CEL backstop leaves out (repeatable; kube-system and kube-node-lease always are)")
	fl.StringArrayVar(&c.Prefilter.Webhooks, "prefilter-webhook", nil, "keep the policy's pre-filter as a match condition on this webhook of --mutating-webhook-configuration or --validating-webhook-configuration (repeatable; the pod webhooks), so the API server calls it only for pods the policy has something to say about")

	fl.Var(newEnumValue(&c.Hardening.InjectVoid, webhook.InjectVoids()), "inject-void", "the hardened-cluster profile: always (as the policy says), never (no void injection, whatever the policy says), or auto: off only while every GPU node's agent reports gpuguard.io/hardened=true, back on as soon as one does not")
	fl.StringVar(&c.Hardening.EnforcerLeaseNamespace, "enforcer-lease-namespace", "", "with --inject-void=auto, the namespace where the agents hold their Leases: a GPU node whose node enforcer holds a fresh one counts as covered, and a hardened mark counts only while the node's agent holds a fresh one of its own")
	fl.Var(&labelsValue{p: &c.Hardening.GPUNodeLabels}, "gpu-node-label", "KEY=VALUE of a label that makes a node a GPU node, for --inject-void=auto (repeatable; any one is enough)")
	fl.StringArrayVar(&c.Hardening.GPUDRADrivers, "gpu-dra-driver", c.Hardening.GPUDRADrivers, "a DRA driver whose devices are GPUs, for --inject-void=auto: a node on which it publishes a ResourceSlice (resource.k8s.io, where served) is a GPU node (repeatable; replaces the default)")

	fl.Var(durationValue{&c.Audit.Interval, 0}, "audit-interval", "audit what exists in the cluster this often, and after every policy change, on one elected replica (0: off; else at least 10s)")
	fl.BoolVar(&c.Audit.Reports, "audit-reports", false, "write the background audit's results as OpenReports (openreports.io/v1alpha1 Report per namespace; needs its CRDs)")
	fl.StringArrayVar(&c.Audit.Excluded, "audit-exclude-namespace", nil, "namespace the background audit leaves out (repeatable; kube-system, kube-node-lease and the policy's always are)")

	fl.Var(positiveIntValue[int64]{&c.Limits.MaxReviews, 1}, "max-inflight-reviews", "reviews worked on at once; more wait up to --overload-wait, then get HTTP 429, which the failure policy handles")
	fl.Var(positiveIntValue[int64]{&c.Limits.MaxReviewBytes, 1}, "max-inflight-review-bytes", "review body bytes worked on at once (a review of the largest pod the API server stores is about 3 MiB, and costs about ten times that to judge)")
	fl.Var(durationValue{&c.Limits.Wait, 0}, "overload-wait", "how long a review waits for room under the limits above")

	fl.Var(positiveIntValue[int]{&c.Limits.MaxHeaderBytes, 1}, "max-header-bytes", "request line and header bytes a request may send; more get HTTP 431 (the API server's AdmissionReview requests carry well under 1 KiB)")
	fl.Var(durationValue{&c.Limits.ReadHeaderTimeout, time.Millisecond}, "read-header-timeout", "how long a connection has for its TLS handshake, and each request for its request line and headers; a sender that stalls is cut off")
	fl.Var(durationValue{&c.Limits.IdleTimeout, time.Millisecond}, "idle-timeout", "how long a keep-alive connection may wait idle for its next request")
	fl.Var(positiveIntValue[int]{&c.Limits.MaxConnections, 1}, "max-connections", "connections served at once; more wait in the kernel's accept queue until one closes")

	f.kube.AddFlags(fl)
	f.logging.AddFlags(fl)
}

func (f *webhookFlags) run(cmd *cobra.Command) error {
	log, err := f.logging.Build()
	if err != nil {
		return &exitError{exitUsage, err.Error()}
	}
	logging.Install(log)
	f.cfg.Log = log
	if err := f.cfg.Validate(); err != nil {
		return &exitError{exitUsage, "invalid webhook configuration:\n" + describeSettings(err)}
	}
	setMemoryLimit(log)
	if f.cfg.Policy.File == "" {
		if f.cfg.RestConfig, err = restConfig(f.kube); err != nil {
			return &exitError{exitUsage, err.Error()}
		}
	}
	return webhook.Run(cmd.Context(), f.cfg)
}

// describeSettings lists the settings Validate refused, one a line, each
// with the flag that sets it.
func describeSettings(err error) string {
	fes := webhook.FieldErrors(err)
	if len(fes) == 0 {
		return "  " + err.Error()
	}
	var b strings.Builder
	for i, fe := range fes {
		if i > 0 {
			b.WriteByte('\n')
		}
		if flag, ok := settingFlags[fe.Field]; ok {
			fmt.Fprintf(&b, "  --%s (%s): %s", flag, fe.Field, fe.Detail)
		} else {
			fmt.Fprintf(&b, "  %s", fe)
		}
	}
	return b.String()
}

// restConfig has no client-side rate limit: admission reads must not queue
// behind each other toward the webhook timeout, and the API server's own
// priority and fairness already protects it.
func restConfig(kube kubeconfig.Flags) (*rest.Config, error) {
	cfg, err := kube.Load()
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = -1, 0
	return cfg, nil
}
