package backgroundaudit

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	openreports "github.com/openreports/reports-api/apis/openreports.io/v1alpha1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	kubefake "k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/gpuguard/gpuguard/webhook/policysource"
	"github.com/gpuguard/gpuguard/webhook/reports"
)

// policyNS is the policy's namespace, left out of the audit like
// kube-system and the configured ones.
const policyNS = "gpuguard"

func namespace(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/metadata.name": name}}}
}

// pod makes a running pod without GPUs: with void it passes, without it
// fails the default policy's final-state rule.
func pod(ns, name string, void bool) *corev1.Pod {
	c := corev1.Container{Name: "main", Image: "busybox"}
	if void {
		c.Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "void"}}
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("uid-" + ns + "-" + name)},
		Spec: corev1.PodSpec{Containers: []corev1.Container{c}}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
}

// cluster is two tenant namespaces, one leaking pod and two clean ones in
// them, and leaking pods in the namespaces the audit leaves out.
func cluster() []runtime.Object {
	return []runtime.Object{
		namespace("team-a"), namespace("team-b"), namespace("kube-system"), namespace(policyNS), namespace("gpu-operator"),
		pod("team-a", "leak", false), pod("team-a", "clean", true), pod("team-b", "clean", true),
		pod("kube-system", "leak", false), pod(policyNS, "leak", false), pod("gpu-operator", "leak", false),
		func() *corev1.Pod { p := pod("team-b", "done", false); p.Status.Phase = corev1.PodSucceeded; return p }(),
	}
}

func source(t *testing.T, spec string) *policysource.Source {
	t.Helper()
	s := policysource.New(policysource.Metrics{
		Reloads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "reloads"}, []string{"result"}),
		Info:    prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "info"}, []string{"hash", "mode"}),
	}, logr.Discard())
	load(t, s, spec)
	return s
}

func load(t *testing.T, s *policysource.Source, spec string) {
	t.Helper()
	if _, err := s.Load("policy.yaml", []byte("apiVersion: gpuguard.io/v1alpha1\nkind: GPUGuardPolicy\nspec:\n"+spec)); err != nil {
		t.Fatal(err)
	}
}

func metrics() Metrics {
	return Metrics{
		Runs:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "runs"}, []string{"result"}),
		Objects:  prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "objects"}, []string{"verdict"}),
		Duration: prometheus.NewGauge(prometheus.GaugeOpts{Name: "duration"}),
	}
}

func reportsScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	if err := openreports.Install(s); err != nil {
		t.Fatal(err)
	}
	return s
}

func newRunner(t *testing.T, c client.Client, o Options, objs ...runtime.Object) *Runner {
	t.Helper()
	return &Runner{clientset: kubefake.NewClientset(objs...), client: c, reader: c, source: source(t, "  mode: enforce\n"),
		options: o, namespace: policyNS, metrics: metrics(), log: logr.Discard()}
}

func verdicts(m Metrics) map[string]float64 {
	out := map[string]float64{}
	for _, v := range []string{"allow", "warn", "deny"} {
		out[v] = testutil.ToFloat64(m.Objects.WithLabelValues(v))
	}
	return out
}

func report(t *testing.T, c client.Reader, ns string) *openreports.Report {
	t.Helper()
	r := &openreports.Report{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: reports.Name}, r); err != nil {
		t.Fatalf("report in %s: %v", ns, err)
	}
	return r
}

func subjects(r *openreports.Report, result openreports.Result) []string {
	var out []string
	for _, res := range r.Results {
		if res.Result == result {
			for _, s := range res.Subjects {
				out = append(out, s.Kind+"/"+s.Name+":"+res.Rule)
			}
		}
	}
	return out
}

func TestOnceJudgesAndWritesReports(t *testing.T) {
	stale := &openreports.Report{ObjectMeta: metav1.ObjectMeta{Name: reports.Name, Namespace: "team-gone", Labels: reports.Labels}}
	old := &openreports.Report{ObjectMeta: metav1.ObjectMeta{Name: reports.Name, Namespace: "team-a", Labels: reports.Labels},
		Summary: openreports.ReportSummary{Fail: 7}}
	// Another tool's report, and an unlabelled one of the same name, stay.
	theirs := &openreports.Report{ObjectMeta: metav1.ObjectMeta{Name: "kyverno", Namespace: "team-gone", Labels: reports.Labels}}
	unlabelled := &openreports.Report{ObjectMeta: metav1.ObjectMeta{Name: reports.Name, Namespace: "team-other"}}
	c := fake.NewClientBuilder().WithScheme(reportsScheme(t)).WithObjects(stale, old, theirs, unlabelled).Build()
	a := newRunner(t, c, Options{Reports: true, Excluded: []string{"gpu-operator"}}, cluster()...)

	a.once(context.Background(), a.source.Engine())

	if got := testutil.ToFloat64(a.metrics.Runs.WithLabelValues("success")); got != 1 {
		t.Errorf("successful runs %v, want 1", got)
	}
	// The leaking pod of team-a is denied; the clean ones pass; the
	// excluded namespaces' and the finished pod are not judged.
	if got, want := verdicts(a.metrics), map[string]float64{"allow": 2, "warn": 0, "deny": 1}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("verdicts %v, want %v", got, want)
	}

	a1 := report(t, c, "team-a")
	if got := subjects(a1, "fail"); !slices.Equal(got, []string{"Pod/leak:final-state"}) {
		t.Errorf("team-a fails %v, want the leaking pod's final-state", got)
	}
	if a1.Summary.Fail != 1 || a1.Summary.Pass != 1 {
		t.Errorf("team-a summary %+v: the old report was not replaced", a1.Summary)
	}
	if b := report(t, c, "team-b"); len(b.Results) != 0 || b.Summary.Pass != 1 {
		t.Errorf("team-b report %+v, want one pass and no results", b)
	}
	for _, ns := range []string{"kube-system", policyNS, "gpu-operator"} {
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: reports.Name}, &openreports.Report{}); !apierrors.IsNotFound(err) {
			t.Errorf("excluded namespace %s has a report (%v)", ns, err)
		}
	}
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(stale), &openreports.Report{}); !apierrors.IsNotFound(err) {
		t.Errorf("the report of a namespace with nothing judged stayed (%v)", err)
	}
	for _, keep := range []*openreports.Report{theirs, unlabelled} {
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(keep), &openreports.Report{}); err != nil {
			t.Errorf("report %s/%s, not gpuguard's, was removed: %v", keep.Namespace, keep.Name, err)
		}
	}
}

func TestOnceWithoutReportsWritesNone(t *testing.T) {
	c := fake.NewClientBuilder().WithScheme(reportsScheme(t)).Build()
	a := newRunner(t, c, Options{}, cluster()...)
	a.once(context.Background(), a.source.Engine())
	list := &openreports.ReportList{}
	if err := c.List(context.Background(), list); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 0 {
		t.Errorf("reports written without Reports: %d", len(list.Items))
	}
	// gpu-operator is not excluded here: its leaking pod counts.
	if got := verdicts(a.metrics)["deny"]; got != 2 {
		t.Errorf("denied %v, want 2", got)
	}
	if got := testutil.ToFloat64(a.metrics.Runs.WithLabelValues("success")); got != 1 {
		t.Errorf("successful runs %v, want 1", got)
	}
}

// logged collects the messages and errors a Runner logs.
type logged struct {
	mu    sync.Mutex
	lines []string
}

func (l *logged) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, args)
	}, funcr.Options{})
}

func (l *logged) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

func TestOnceReportsCRDsMissing(t *testing.T) {
	c := fake.NewClientBuilder().WithScheme(reportsScheme(t)).WithInterceptorFuncs(interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			return &meta.NoKindMatchError{GroupKind: schema.GroupKind{Group: "openreports.io", Kind: "Report"}}
		},
	}).Build()
	a := newRunner(t, c, Options{Reports: true}, cluster()...)
	l := &logged{}
	a.log = l.logger()
	a.once(context.Background(), a.source.Engine())
	if got := testutil.ToFloat64(a.metrics.Runs.WithLabelValues("error")); got != 1 {
		t.Errorf("failed runs %v, want 1", got)
	}
	if got := testutil.ToFloat64(a.metrics.Runs.WithLabelValues("success")); got != 0 {
		t.Errorf("successful runs %v, want 0", got)
	}
	if !strings.Contains(l.String(), "OpenReports CRDs") || !strings.Contains(l.String(), "audit.reports") {
		t.Errorf("the log does not say the CRDs are missing:\n%s", l)
	}
}

func TestOnceOneNamespaceFailingKeepsTheOthers(t *testing.T) {
	c := fake.NewClientBuilder().WithScheme(reportsScheme(t)).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if obj.GetNamespace() == "team-a" {
				return apierrors.NewForbidden(schema.GroupResource{Group: "openreports.io", Resource: "reports"}, obj.GetName(), errors.New("quota"))
			}
			return c.Create(ctx, obj, opts...)
		},
	}).Build()
	a := newRunner(t, c, Options{Reports: true}, cluster()...)
	a.once(context.Background(), a.source.Engine())
	report(t, c, "team-b")
	if got := testutil.ToFloat64(a.metrics.Runs.WithLabelValues("error")); got != 1 {
		t.Errorf("failed runs %v, want 1", got)
	}
}

func TestOnceAuditFailureChangesNothing(t *testing.T) {
	c := fake.NewClientBuilder().WithScheme(reportsScheme(t)).Build()
	a := newRunner(t, c, Options{Reports: true}, cluster()...)
	a.metrics.Objects.WithLabelValues("deny").Set(5)
	a.clientset.(*kubefake.Clientset).PrependReactor("list", "pods", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("etcd is down")
	})
	a.once(context.Background(), a.source.Engine())
	if got := testutil.ToFloat64(a.metrics.Runs.WithLabelValues("error")); got != 1 {
		t.Errorf("failed runs %v, want 1", got)
	}
	if got := verdicts(a.metrics)["deny"]; got != 5 {
		t.Errorf("a failed audit set the verdicts: deny %v", got)
	}
	list := &openreports.ReportList{}
	if err := c.List(context.Background(), list); err != nil || len(list.Items) != 0 {
		t.Errorf("a failed audit wrote %d reports (%v)", len(list.Items), err)
	}
}

// TestStartElectsAuditsAndReleases runs the Runner as the manager does: it
// takes the audit Lease in the policy's namespace, audits at once, audits
// again when the policy changes, and gives the Lease up when stopped.
func TestStartElectsAuditsAndReleases(t *testing.T) {
	c := fake.NewClientBuilder().WithScheme(reportsScheme(t)).Build()
	a := newRunner(t, c, Options{Interval: time.Hour}, cluster()...)
	if a.NeedLeaderElection() {
		t.Error("the Runner asks for the manager's election; it elects itself")
	}
	cs := a.clientset.(*kubefake.Clientset)
	// Each audit lists pods once: the list hands the test the Lease as it
	// stands while the audit runs.
	audits := make(chan *coordinationv1.Lease, 4)
	cs.PrependReactor("list", "pods", func(clienttesting.Action) (bool, runtime.Object, error) {
		l, err := cs.Tracker().Get(coordinationv1.SchemeGroupVersion.WithResource("leases"), policyNS, auditLease)
		if err != nil {
			t.Errorf("auditing without the Lease: %v", err)
			audits <- nil
		} else {
			audits <- l.(*coordinationv1.Lease)
		}
		return false, nil, nil
	})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.Start(ctx) }()

	wait := func(what string) *coordinationv1.Lease {
		t.Helper()
		select {
		case l := <-audits:
			return l
		case <-time.After(30 * time.Second):
			t.Fatalf("no audit %s", what)
			return nil
		}
	}
	l := wait("after taking the Lease")
	if l != nil && (l.Spec.HolderIdentity == nil || !strings.HasSuffix(*l.Spec.HolderIdentity, fmt.Sprintf("_%d", os.Getpid()))) {
		t.Errorf("Lease held by %v, want this process", l.Spec.HolderIdentity)
	}

	// A new policy is audited well before the hour's interval is up.
	load(t, a.source, "  mode: warn\n")
	wait("after the policy changed")

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Start: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Start did not return once stopped")
	}
	lease, err := cs.CoordinationV1().Leases(policyNS).Get(context.Background(), auditLease, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := lease.Spec.HolderIdentity; h != nil && *h != "" {
		t.Errorf("the Lease is still held by %s after the Runner stopped", *h)
	}
}
