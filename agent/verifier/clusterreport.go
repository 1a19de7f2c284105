package verifier

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"time"

	openreports "github.com/openreports/reports-api/apis/openreports.io/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuguard/gpuguard/internal/wellknown"
)

// RuleUnallocatedGPUAccess names the verifier's finding in reports.
const RuleUnallocatedGPUAccess = "unallocated-gpu-access"

var clusterReports = openreports.SchemeGroupVersion.WithResource("clusterreports")

// NodeReport writes the node's findings as an OpenReports ClusterReport,
// gpuguard-node-<node>, beside the namespaced Reports of the webhook's audit.
// It writes when the findings change. Every resyncEvery it also reads the
// stored report, and writes it again only if it was deleted or edited by
// hand: at a fleet's size, writes grow with changes, not with time.
type NodeReport struct {
	Client dynamic.Interface
	Node   string
	// Nodes, when set, makes the Node the report's owner, so that the
	// garbage collector removes the report with the node.
	Nodes kubernetes.Interface
	owner []metav1.OwnerReference

	written   []openreports.ReportResult // the results last written, without timestamps
	checkedAt time.Time                  // when the stored report was last written or read
}

// resyncEvery is how often the stored ClusterReport is read, when nothing
// changed, to bring back one deleted or edited by hand.
const resyncEvery = 5 * time.Minute

// Name is the ClusterReport's name.
func (n *NodeReport) Name() string { return "gpuguard-node-" + n.Node }

// Write brings the ClusterReport in line with a pass.
func (n *NodeReport) Write(ctx context.Context, p Pass, now time.Time) error {
	want := n.build(p, now)
	unchanged := n.written != nil && reflect.DeepEqual(untimed(want.Results), n.written)
	if unchanged && now.Sub(n.checkedAt) < resyncEvery {
		return nil
	}
	want.OwnerReferences = n.ownerReferences(ctx)
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(want)
	if err != nil {
		return err
	}
	u := &unstructured.Unstructured{Object: obj}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res := n.Client.Resource(clusterReports)
	cur, err := res.Get(ctx, n.Name(), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = res.Create(ctx, u, metav1.CreateOptions{})
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("the OpenReports CRDs (openreports.io/v1alpha1) are not installed: %w", err)
		}
	case err == nil && unchanged && stillWritten(cur, want):
		n.checkedAt = now
		return nil
	case err == nil:
		u.SetResourceVersion(cur.GetResourceVersion())
		_, err = res.Update(ctx, u, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("writing ClusterReport %s: %w", n.Name(), err)
	}
	n.written, n.checkedAt = untimed(want.Results), now
	return nil
}

// stillWritten says whether the stored report says what want says: the
// same results (timestamps aside), summary, labels and owners.
func stillWritten(cur *unstructured.Unstructured, want *openreports.ClusterReport) bool {
	stored := &openreports.ClusterReport{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(cur.Object, stored); err != nil {
		return false
	}
	return reflect.DeepEqual(untimed(stored.Results), untimed(want.Results)) && stored.Summary == want.Summary &&
		maps.Equal(stored.Labels, want.Labels) && reflect.DeepEqual(stored.OwnerReferences, want.OwnerReferences)
}

func (n *NodeReport) build(p Pass, now time.Time) *openreports.ClusterReport {
	r := &openreports.ClusterReport{
		TypeMeta:   metav1.TypeMeta{APIVersion: openreports.SchemeGroupVersion.String(), Kind: "ClusterReport"},
		ObjectMeta: metav1.ObjectMeta{Name: n.Name(), Labels: wellknown.OwnedLabels(wellknown.ComponentAgent)},
		Source:     wellknown.AgentReportSource,
		Scope:      &corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: n.Node},
		Results:    []openreports.ReportResult{},
	}
	reached := map[string]bool{}
	for _, f := range p.Findings {
		if f.Exempt != "" {
			continue
		}
		reached[f.Container.ID] = true
		c := f.Container
		r.Results = append(r.Results, openreports.ReportResult{
			Source: wellknown.AgentReportSource, Policy: wellknown.ReportPolicy, Rule: RuleUnallocatedGPUAccess, Category: "GPU isolation",
			Severity: "critical", Result: "fail", Scored: true, Timestamp: metav1.Timestamp{Seconds: now.Unix()},
			Subjects: []corev1.ObjectReference{{APIVersion: "v1", Kind: "Pod", Namespace: c.Key.Namespace, Name: c.Key.Pod,
				UID: types.UID(c.PodUID), FieldPath: fmt.Sprintf("spec.containers{%s}", c.Key.Container)}},
			Description: Message([]Finding{f}),
			Properties: map[string]string{"container": c.Key.Container, "gpu": f.GPU.UUID, "path": f.GPU.Path,
				"seenBy": f.SeenBy, "node": n.Node},
		})
	}
	r.Summary.Fail = len(r.Results)
	r.Summary.Pass = p.Containers - len(reached)
	return r
}

// ownerReferences names the Node, once its UID is known.
func (n *NodeReport) ownerReferences(ctx context.Context) []metav1.OwnerReference {
	if n.owner != nil || n.Nodes == nil {
		return n.owner
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	node, err := n.Nodes.CoreV1().Nodes().Get(ctx, n.Node, metav1.GetOptions{})
	if err != nil {
		return nil // written without an owner; asked again next write
	}
	n.owner = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}}
	return n.owner
}

// untimed are results without their timestamps, for comparing passes.
func untimed(results []openreports.ReportResult) []openreports.ReportResult {
	out := make([]openreports.ReportResult, len(results))
	for i, r := range results {
		r.Timestamp = metav1.Timestamp{}
		out[i] = r
	}
	return out
}
