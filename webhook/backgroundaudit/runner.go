// Package backgroundaudit judges, on one elected webhook replica, what already
// exists in the cluster: pods from before the webhook or from an outage, and
// the templates of pod controllers. It publishes the results as metrics and,
// optionally, as OpenReports.
package backgroundaudit

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/go-logr/logr"
	openreports "github.com/openreports/reports-api/apis/openreports.io/v1alpha1"
	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/gpuguard/gpuguard/internal/audit"
	"github.com/gpuguard/gpuguard/internal/wellknown"
	"github.com/gpuguard/gpuguard/policy"
	"github.com/gpuguard/gpuguard/webhook/policysource"
	"github.com/gpuguard/gpuguard/webhook/reports"
)

// Options turn on the background audit: every Interval, and whenever the
// policy changes, one elected replica judges what exists in the cluster and,
// with Reports, writes the results as OpenReports.
type Options struct {
	Interval time.Duration
	Reports  bool
	// Excluded namespaces besides kube-system, kube-node-lease and the policy's.
	Excluded []string
}

// auditLease is the Lease the replicas elect the auditor with.
const auditLease = wellknown.AuditLease

// policyPoll is how often the auditor looks for a new policy.
const policyPoll = 2 * time.Second

// Runner is the background audit. It runs on every replica and elects one
// through its own Lease, so that only the audit waits for leadership, never the
// webhook server or the policy watch.
type Runner struct {
	clientset kubernetes.Interface
	client    client.Client
	// reader reads Reports straight from the API server: no cluster-wide watch.
	reader    client.Reader
	source    *policysource.Source
	options   Options
	namespace string // the policy's, for the Lease and left out of the audit
	metrics   Metrics
	log       logr.Logger
}

// Metrics are the collectors a Runner updates.
type Metrics struct {
	// Runs counts audits by result: success or error.
	Runs *prometheus.CounterVec
	// Objects are the last audit's objects by verdict: allow, warn, deny.
	Objects *prometheus.GaugeVec
	// Duration is how long the last successful audit took.
	Duration prometheus.Gauge
}

// New makes a Runner over mgr's clients that audits with the policy of source
// and holds its Lease in namespace, the policy's.
func New(mgr manager.Manager, source *policysource.Source, namespace string, o Options, m Metrics, log logr.Logger) (*Runner, error) {
	clientset, err := kubernetes.NewForConfig(mgr.GetConfig())
	if err != nil {
		return nil, err
	}
	return &Runner{clientset: clientset, client: mgr.GetClient(), reader: mgr.GetAPIReader(), source: source,
		options: o, namespace: namespace, metrics: m, log: log}, nil
}

// NeedLeaderElection is false: the auditor elects itself (see Start).
func (a *Runner) NeedLeaderElection() bool { return false }

// Start campaigns for the Lease until ctx is done, auditing while it leads.
func (a *Runner) Start(ctx context.Context) error {
	identity, _ := os.Hostname()
	identity = fmt.Sprintf("%s_%d", identity, os.Getpid())
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: auditLease, Namespace: a.namespace},
		Client:     a.clientset.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: identity},
	}
	for ctx.Err() == nil {
		leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
			Lock: lock, LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second,
			ReleaseOnCancel: true, Name: auditLease,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: a.lead,
				OnStoppedLeading: func() { a.log.Info("no longer the auditing replica") },
			},
		})
	}
	return nil
}

// lead audits every interval and after every policy change, while leading.
func (a *Runner) lead(ctx context.Context) {
	a.log.Info("auditing the cluster", "interval", a.options.Interval.String(), "reports", a.options.Reports)
	poll := time.NewTicker(policyPoll)
	defer poll.Stop()
	var audited *policy.Engine
	var last time.Time
	for {
		if e := a.source.Engine(); e != nil && (e != audited || time.Since(last) >= a.options.Interval) {
			a.once(ctx, e)
			audited, last = e, time.Now()
		}
		select {
		case <-ctx.Done():
			return
		case <-poll.C:
		}
	}
}

func (a *Runner) once(ctx context.Context, e *policy.Engine) {
	start := time.Now()
	excluded := slices.Concat(audit.DefaultExcluded, []string{a.namespace}, a.options.Excluded)
	out, err := audit.Run(ctx, a.clientset, e, audit.Options{Excluded: excluded})
	if err != nil {
		a.metrics.Runs.WithLabelValues("error").Inc()
		a.log.Error(err, "background audit failed")
		return
	}
	denied, warned := 0, 0
	for _, j := range out.Judged {
		switch {
		case !j.Result.Allowed:
			denied++
		case len(j.Result.Violations) > 0:
			warned++
		}
	}
	a.metrics.Objects.WithLabelValues("deny").Set(float64(denied))
	a.metrics.Objects.WithLabelValues("warn").Set(float64(warned))
	a.metrics.Objects.WithLabelValues("allow").Set(float64(len(out.Judged) - denied - warned))
	if a.options.Reports {
		if err := a.writeReports(ctx, reports.Build(out, time.Now())); err != nil {
			a.metrics.Runs.WithLabelValues("error").Inc()
			a.log.Error(err, "writing the audit's OpenReports")
			return
		}
	}
	took := time.Since(start)
	a.metrics.Runs.WithLabelValues("success").Inc()
	a.metrics.Duration.Set(took.Seconds())
	a.log.Info("background audit", "judged", len(out.Judged), "denied", denied, "warned", warned, "took", took.Round(time.Millisecond).String())
}

// writeReports creates or updates gpuguard's Report in every namespace that
// has one now, and deletes it where it has none any more: a result goes with
// its object.
func (a *Runner) writeReports(ctx context.Context, want map[string]*openreports.Report) error {
	existing := &openreports.ReportList{}
	err := a.reader.List(ctx, existing, client.MatchingLabels(reports.Labels))
	if meta.IsNoMatchError(err) {
		return fmt.Errorf("the OpenReports CRDs (openreports.io/v1alpha1) are not installed: install them (the chart does with reports.enabled) or turn audit.reports off: %w", err)
	}
	if err != nil {
		return err
	}
	for i := range existing.Items {
		old := &existing.Items[i]
		if _, keep := want[old.Namespace]; !keep && old.Name == reports.Name {
			if err := a.client.Delete(ctx, old); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
		}
	}
	// One namespace's failure does not keep the others' reports stale.
	var errs []error
	for _, r := range want {
		if err := a.upsert(ctx, r); err != nil {
			errs = append(errs, fmt.Errorf("writing report %s/%s: %w", r.Namespace, r.Name, err))
		}
	}
	return errors.Join(errs...)
}

func (a *Runner) upsert(ctx context.Context, r *openreports.Report) error {
	cur := &openreports.Report{}
	err := a.reader.Get(ctx, client.ObjectKeyFromObject(r), cur)
	if apierrors.IsNotFound(err) {
		return a.client.Create(ctx, r)
	}
	if err != nil {
		return err
	}
	r.ResourceVersion = cur.ResourceVersion
	return a.client.Update(ctx, r)
}
