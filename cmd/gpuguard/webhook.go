package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/gpuguard/gpuguard/cel"
	"github.com/gpuguard/gpuguard/internal/kubeconfig"
	"github.com/gpuguard/gpuguard/internal/logging"
	"github.com/gpuguard/gpuguard/webhook"
	"github.com/gpuguard/gpuguard/webhook/backgroundaudit"
	"github.com/gpuguard/gpuguard/webhook/hardening"
)

type webhookFlags struct {
	opts            webhook.Options
	policyConfigMap string
	certSecret      string
	kube            kubeconfig.Flags
	logging         logging.Options
	backstop        bool
	backstopOptions cel.Options
	audit           backgroundaudit.Options
	gpuNodeLabels   []string
}

func newWebhookCommand() *cobra.Command {
	f := &webhookFlags{}
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
mounted Secret.`,
		Example: `  gpuguard webhook --policy-file --cert-dir ./certs
  gpuguard webhook --policy-configmap gpuguard/gpuguard-policy \
    --cert-secret gpuguard/gpuguard-webhook-tls --service-name gpuguard-webhook \
    --mutating-webhook-configuration gpuguard --validating-webhook-configuration gpuguard`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			// "--policy-file FILE" with a space: the value arrives as an argument.
			if len(args) == 1 {
				if f.opts.PolicyFile != webhook.BuiltinPolicy {
					return fmt.Errorf("unexpected argument %q", args[0])
				}
				f.opts.PolicyFile = args[0]
			}
			return f.run(cmd)
		},
	}
	fl := cmd.Flags()
	o := &f.opts
	fl.StringVar(&o.Host, "host", "", "address to listen on (default: all)")
	fl.IntVar(&o.Port, "port", 9443, "HTTPS port of /mutate and /validate")
	fl.StringVar(&o.CertDir, "cert-dir", "/tmp/k8s-webhook-server/serving-certs", "directory with the serving certificate and key")
	fl.StringVar(&o.CertName, "cert-name", "tls.crt", "certificate file name in --cert-dir")
	fl.StringVar(&o.KeyName, "key-name", "tls.key", "key file name in --cert-dir")
	fl.BoolVar(&o.EnableHTTP2, "enable-http2", false, "serve HTTP/2 as well as HTTP/1.1")
	fl.StringVar(&o.PolicyFile, "policy-file", "", "run standalone with this policy file; alone, the built-in policy")
	fl.Lookup("policy-file").NoOptDefVal = webhook.BuiltinPolicy
	fl.StringVar(&f.policyConfigMap, "policy-configmap", "gpuguard/gpuguard-policy", "NAMESPACE/NAME of the policy ConfigMap")
	fl.BoolVar(&o.PolicyFallback, "policy-fallback", true, "while the policy ConfigMap has never held a valid policy, enforce the built-in default policy and stay ready (a Warning Event PolicyFallback and gpuguard_policy_fallback say so); false: stay unready, so the failure policy applies")
	fl.StringVar(&o.MetricsAddr, "metrics-bind-address", ":8080", "address of /metrics (0 to disable)")
	fl.StringVar(&o.ProbeAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz")
	fl.StringVar(&o.PprofAddr, "pprof-bind-address", "", "address of Go's profiles (/debug/pprof/), for profiling under load; empty: off")
	fl.DurationVar(&o.ConfigMapCacheTTL, "configmap-cache-ttl", 10*time.Second, "how long a ConfigMap read for envFrom inspection is reused")
	fl.StringVar(&f.certSecret, "cert-secret", "", "NAMESPACE/NAME: manage certificates in this Secret (cert-controller)")
	fl.StringVar(&o.ServiceName, "service-name", "gpuguard-webhook", "the webhook Service, for the certificate's DNS name")
	fl.StringVar(&o.MutatingConfig, "mutating-webhook-configuration", "", "MutatingWebhookConfiguration to inject the CA bundle into")
	fl.StringVar(&o.ValidatingConfig, "validating-webhook-configuration", "", "ValidatingWebhookConfiguration to inject the CA bundle into (self-managed certificates)")
	fl.StringSliceVar(&o.ExtraDNSNames, "extra-dns-names", nil, "more DNS names for the serving certificate (e.g. localhost)")
	fl.BoolVar(&o.WriteCertDir, "write-cert-dir", false, "with --cert-secret: write the Secret's certificate and key into --cert-dir (writable, e.g. an emptyDir) as they change, rather than wait for the kubelet to refresh a mounted Secret (a minute or more)")
	fl.StringVar((*string)(&o.Role), "role", string(webhook.RoleAll), "all: answer reviews and keep what the webhook keeps in the cluster; serve: answer reviews and write nothing of admission configuration (certificates read from --cert-secret); control: keep the certificate, the CEL backstop, the pre-filter and the background audit, and answer no review")
	fl.BoolVar(&f.backstop, "cel-backstop", false, "keep the policy's CEL backstop (ValidatingAdmissionPolicy and MutatingAdmissionPolicy) applied in the cluster (with --role=serve: another process applies it)")
	fl.StringVar(&f.backstopOptions.Name, "cel-backstop-name", cel.DefaultName, "name of the CEL backstop's policies and bindings")
	fl.BoolVar(&f.backstopOptions.KAIGuardOnly, "cel-backstop-kai-guard-only", false, "with --cel-backstop, apply only the KAI ConfigMap guard (a ValidatingAdmissionPolicy, Kubernetes 1.30 or later) while the policy turns KAI fractions on: for API servers without MutatingAdmissionPolicy, where the rest of the backstop cannot run")
	fl.StringVar(&f.opts.BackstopOwner, "cel-backstop-owner", "", "ClusterRole that owns the CEL backstop: deleting it (helm uninstall) garbage-collects the backstop; deleting the webhook configurations does not. Empty: the backstop has no owner")
	fl.StringArrayVar(&f.opts.UnguardedNamespaces, "unguarded-namespace", nil, "a namespace the webhook configurations leave out (repeatable; the chart passes its excluded namespaces): one that does not exist is reported, since whoever creates it gets an unguarded namespace")
	fl.StringArrayVar(&f.backstopOptions.ExcludedNamespaces, "cel-backstop-exclude-namespace", nil, "namespace the CEL backstop leaves out (repeatable; kube-system and kube-node-lease always are)")
	fl.StringArrayVar(&o.PrefilterWebhooks, "prefilter-webhook", nil, "keep the policy's pre-filter as a match condition on this webhook of --mutating-webhook-configuration or --validating-webhook-configuration (repeatable; the pod webhooks), so the API server calls it only for pods the policy has something to say about")
	fl.StringVar((*string)(&o.InjectVoid), "inject-void", string(webhook.InjectAlways), "the hardened-cluster profile: always (as the policy says), never (no void injection, whatever the policy says), or auto: off only while every GPU node's agent reports gpuguard.io/hardened=true, back on as soon as one does not")
	fl.StringVar(&f.opts.EnforcerLeaseNamespace, "enforcer-lease-namespace", "", "with --inject-void=auto, the namespace where the agents hold their Leases: a GPU node whose node enforcer holds a fresh one counts as covered, and a hardened mark counts only while the node's agent holds a fresh one of its own")
	fl.StringArrayVar(&f.gpuNodeLabels, "gpu-node-label", []string{"nvidia.com/gpu.present=true", "feature.node.kubernetes.io/pci-10de.present=true"}, "KEY=VALUE of a label that makes a node a GPU node, for --inject-void=auto (repeatable; any one is enough)")
	fl.DurationVar(&f.audit.Interval, "audit-interval", 0, "audit what exists in the cluster this often, and after every policy change, on one elected replica (0: off)")
	fl.BoolVar(&f.audit.Reports, "audit-reports", false, "write the background audit's results as OpenReports (openreports.io/v1alpha1 Report per namespace; needs its CRDs)")
	fl.StringArrayVar(&f.audit.Excluded, "audit-exclude-namespace", nil, "namespace the background audit leaves out (repeatable; kube-system, kube-node-lease and the policy's always are)")
	limits := webhook.DefaultLimits()
	fl.Int64Var(&o.Limits.MaxReviews, "max-inflight-reviews", limits.MaxReviews, "reviews worked on at once; more wait up to --overload-wait, then get HTTP 429, which the failure policy handles")
	fl.Int64Var(&o.Limits.MaxReviewBytes, "max-inflight-review-bytes", limits.MaxReviewBytes, "review body bytes worked on at once (a review of the largest pod the API server stores is about 3 MiB, and costs about ten times that to judge)")
	fl.DurationVar(&o.Limits.Wait, "overload-wait", limits.Wait, "how long a review waits for room under the limits above")
	fl.DurationVar(&o.ShutdownDelay, "shutdown-delay", 0, "after SIGTERM, keep serving this long while reporting not ready, each answer closing its connection, so that the Service and the API server stop sending reviews here first")
	fl.DurationVar(&o.APIReadTimeout, "api-read-timeout", 2*time.Second, "bound on each namespace or ConfigMap read a review needs; keep it under the webhooks' timeoutSeconds")
	f.kube.AddFlags(fl)
	f.logging.AddFlags(fl)
	return cmd
}

func (f *webhookFlags) run(cmd *cobra.Command) error {
	log, err := f.logging.Build()
	if err != nil {
		return &exitError{exitUsage, err.Error()}
	}
	logging.Install(log)
	f.opts.Log = log
	setMemoryLimit(log)
	if f.opts.PolicyFile == "" {
		if f.opts.PolicyConfigMap, err = namespacedName("--policy-configmap", f.policyConfigMap); err != nil {
			return &exitError{exitUsage, err.Error()}
		}
		if f.opts.RestConfig, err = restConfig(f.kube); err != nil {
			return &exitError{exitUsage, err.Error()}
		}
	}
	if f.backstop {
		if f.opts.PolicyFile != "" {
			return &exitError{exitUsage, "--cel-backstop needs an API server; it cannot run with --policy-file"}
		}
		f.opts.CELBackstop = &f.backstopOptions
	}
	if f.backstopOptions.KAIGuardOnly && !f.backstop {
		return &exitError{exitUsage, "--cel-backstop-kai-guard-only narrows what --cel-backstop applies: it needs --cel-backstop"}
	}
	if f.opts.BackstopOwner != "" && !f.backstop {
		return &exitError{exitUsage, "--cel-backstop-owner names the owner of the CEL backstop: it needs --cel-backstop"}
	}
	for _, l := range f.gpuNodeLabels {
		label, err := hardening.ParseLabel(l)
		if err != nil {
			return &exitError{exitUsage, "--gpu-node-label: " + err.Error()}
		}
		f.opts.GPUNodeLabels = append(f.opts.GPUNodeLabels, label)
	}
	if len(f.opts.PrefilterWebhooks) > 0 && (f.opts.PolicyFile != "" || f.opts.MutatingConfig == "" && f.opts.ValidatingConfig == "") {
		return &exitError{exitUsage, "--prefilter-webhook needs an API server and the configurations that hold the webhooks (--mutating-webhook-configuration, --validating-webhook-configuration)"}
	}
	switch {
	case f.audit.Interval < 0 || (f.audit.Interval > 0 && f.audit.Interval < 10*time.Second):
		return &exitError{exitUsage, fmt.Sprintf("--audit-interval %s: use 0 (off) or at least 10s", f.audit.Interval)}
	case f.audit.Interval > 0 && f.opts.PolicyFile != "":
		return &exitError{exitUsage, "--audit-interval needs an API server; it cannot run with --policy-file"}
	case f.audit.Interval > 0:
		f.opts.Audit = &f.audit
	case f.audit.Reports:
		return &exitError{exitUsage, "--audit-reports writes the background audit's results; set --audit-interval"}
	}
	if f.certSecret != "" {
		if f.opts.CertSecret, err = namespacedName("--cert-secret", f.certSecret); err != nil {
			return &exitError{exitUsage, err.Error()}
		}
	}
	if f.opts.WriteCertDir && f.certSecret == "" {
		return &exitError{exitUsage, "--write-cert-dir writes the certificates of --cert-secret; name the Secret"}
	}
	return webhook.Run(cmd.Context(), f.opts)
}

func namespacedName(flag, value string) (types.NamespacedName, error) {
	ns, name, ok := strings.Cut(value, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return types.NamespacedName{}, fmt.Errorf("%s %q: want NAMESPACE/NAME", flag, value)
	}
	return types.NamespacedName{Namespace: ns, Name: name}, nil
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
