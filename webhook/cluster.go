package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	openreports "github.com/openreports/reports-api/apis/openreports.io/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/gpuguard/gpuguard/internal/backstop"
	"github.com/gpuguard/gpuguard/internal/policysource"
	"github.com/gpuguard/gpuguard/policy"
)

// runInCluster serves with a policy ConfigMap watched through the API server,
// namespace labels from a cache, and ConfigMaps read on demand for envFrom.
func runInCluster(ctx context.Context, o Options) error {
	if o.PolicyConfigMap.Name == "" || o.PolicyConfigMap.Namespace == "" {
		return errors.New("--policy-configmap NAMESPACE/NAME is required without --policy-file")
	}
	if o.RestConfig == nil {
		return errors.New("no API server configuration: give --kubeconfig, run in a cluster, or use --policy-file")
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := openreports.Install(scheme); err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(o.RestConfig, manager.Options{
		Scheme:                 scheme,
		Logger:                 o.Log,
		Metrics:                metricsserver.Options{BindAddress: o.MetricsAddr},
		HealthProbeBindAddress: o.ProbeAddr,
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			// Only the policy ConfigMap is watched; others are read on demand.
			&corev1.ConfigMap{}: {
				Namespaces: map[string]cache.Config{o.PolicyConfigMap.Namespace: {}},
				Field:      fields.OneTermEqualSelector("metadata.name", o.PolicyConfigMap.Name),
			},
		}},
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	m := DefaultMetrics()
	source := NewPolicySource(m, o.Log.WithName("policy"))
	namespaces := newNamespaceCache(mgr.GetCache(), mgr.GetAPIReader(), o.APIReadTimeout)
	reconciler := &policysource.Reconciler{
		Key: o.PolicyConfigMap, Reader: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Source: source,
		Events: mgr.GetEventRecorder("gpuguard"), Reloads: m.PolicyReloads, MissingExemptNS: m.MissingExemptNS, Log: o.Log.WithName("policy"),
	}
	if o.CELBackstop != nil {
		sync := &backstop.Sync{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Options: *o.CELBackstop, Owner: o.ValidatingConfig,
			Source: source, Syncs: m.BackstopSyncs, Log: o.Log.WithName("backstop")}
		reconciler.Apply = sync.Apply
		if err := mgr.Add(sync); err != nil {
			return err
		}
	}
	if err := reconciler.Setup(mgr); err != nil {
		return err
	}
	if o.Audit != nil {
		if err := addAuditor(mgr, o, source, m); err != nil {
			return err
		}
	}
	if err := mgr.Add(namespaces); err != nil {
		return err
	}
	configMaps := newConfigMapReader(mgr.GetAPIReader(), o.ConfigMapCacheTTL, o.APIReadTimeout, m)
	srv := newWebhookServer(o)
	serveCtx := afterDelay(ctx, o.ShutdownDelay)
	registerHandlers(srv, newGate(o.limits(), source.Loaded, serveCtx.Done(), m), func(phase policy.Phase) *Handler {
		return &Handler{Phase: phase, Policies: source, Namespaces: namespaces, ConfigMaps: configMaps,
			Metrics: m, Log: o.Log.WithName(string(phase))}
	})
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	for name, check := range map[string]healthz.Checker{"policy": source.Ready, "namespaces": namespaces.Ready,
		"webhook": srv.StartedChecker(), "stopping": notStopping(ctx)} {
		if err := mgr.AddReadyzCheck(name, check); err != nil {
			return err
		}
	}
	if err := addWebhookServer(mgr, afterPolicy(srv, source), o); err != nil {
		return err
	}
	return mgr.Start(serveCtx)
}

// addAuditor adds the background audit, which elects its own replica.
func addAuditor(mgr manager.Manager, o Options, source *policysource.Source, m *Metrics) error {
	clientset, err := kubernetes.NewForConfig(mgr.GetConfig())
	if err != nil {
		return err
	}
	return mgr.Add(&auditSync{clientset: clientset, client: mgr.GetClient(), reader: mgr.GetAPIReader(), source: source, options: *o.Audit,
		namespace: o.PolicyConfigMap.Namespace, metrics: m, log: o.Log.WithName("audit")})
}

// addWebhookServer starts the TLS server at once when certificates come from
// CertDir, or once cert-controller has written them when gpuguard manages them.
func addWebhookServer(mgr manager.Manager, srv manager.Runnable, o Options) error {
	if o.CertSecret.Name == "" {
		return mgr.Add(srv)
	}
	if o.WriteCertDir {
		client, err := kubernetes.NewForConfig(mgr.GetConfig())
		if err != nil {
			return err
		}
		if err := mgr.Add(newCertDirWriter(client, o)); err != nil {
			return err
		}
	}
	ready := make(chan struct{})
	var webhooks []rotator.WebhookInfo
	if o.MutatingConfig != "" {
		webhooks = append(webhooks, rotator.WebhookInfo{Name: o.MutatingConfig, Type: rotator.Mutating})
	}
	if o.ValidatingConfig != "" {
		webhooks = append(webhooks, rotator.WebhookInfo{Name: o.ValidatingConfig, Type: rotator.Validating})
	}
	err := rotator.AddRotator(mgr, &rotator.CertRotator{
		SecretKey:      o.CertSecret,
		CertDir:        o.CertDir,
		CertName:       o.CertName,
		KeyName:        o.KeyName,
		CAName:         "gpuguard-ca",
		CAOrganization: "gpuguard",
		DNSName:        fmt.Sprintf("%s.%s.svc", o.ServiceName, o.CertSecret.Namespace),
		ExtraDNSNames:  o.ExtraDNSNames,
		IsReady:        ready,
		Webhooks:       webhooks,
	})
	if err != nil {
		return fmt.Errorf("setting up certificate rotation: %w", err)
	}
	// A runnable added after the manager started is started at once.
	return mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		select {
		case <-ready:
			return mgr.Add(srv)
		case <-ctx.Done():
			return nil
		}
	}))
}

// namespaceCache serves namespace labels from a metadata-only informer, and from
// the API server for a namespace the informer has not seen yet (one created a
// moment before its first pod).
type namespaceCache struct {
	cache   cache.Cache
	reader  client.Reader
	timeout time.Duration // of one read from the API server
	synced  chan struct{}
}

func newNamespaceCache(c cache.Cache, r client.Reader, timeout time.Duration) *namespaceCache {
	return &namespaceCache{cache: c, reader: r, timeout: timeout, synced: make(chan struct{})}
}

func namespaceMeta() *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Namespace"))
	return m
}

// Start warms the informer, so that the first admission does not wait for it.
func (n *namespaceCache) Start(ctx context.Context) error {
	if _, err := n.cache.GetInformer(ctx, namespaceMeta()); err != nil {
		return fmt.Errorf("watching namespaces: %w", err)
	}
	if n.cache.WaitForCacheSync(ctx) {
		close(n.synced)
	}
	return nil
}

func (n *namespaceCache) NamespaceLabels(ctx context.Context, name string) (map[string]string, error) {
	m := namespaceMeta()
	err := n.cache.Get(ctx, client.ObjectKey{Name: name}, m)
	if apierrors.IsNotFound(err) {
		ctx, cancel := withReadTimeout(ctx, n.timeout)
		defer cancel()
		err = n.reader.Get(ctx, client.ObjectKey{Name: name}, m)
	}
	if err != nil {
		return nil, err
	}
	return m.Labels, nil
}

// Ready fails until the namespace cache has synced.
func (n *namespaceCache) Ready(*http.Request) error {
	select {
	case <-n.synced:
		return nil
	default:
		return errors.New("namespace cache not synced yet")
	}
}
