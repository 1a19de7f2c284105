// Package reports turns gpuguard's audit results into OpenReports
// (openreports.io/v1alpha1), the successor of the policy working group's
// PolicyReport that Kyverno and Kubewarden emit, so that Policy Reporter and
// the dashboards built on it show gpuguard's results without new tooling.
package reports

import (
	"fmt"
	"sort"
	"strings"
	"time"

	openreports "github.com/openreports/reports-api/apis/openreports.io/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuguard/gpuguard/internal/audit"
	"github.com/gpuguard/gpuguard/internal/wellknown"
	"github.com/gpuguard/gpuguard/policy"
)

// Name is the name of gpuguard's Report in each namespace.
const Name = "gpuguard"

// MaxResults bounds the results of one Report, which etcd stores as one
// object: the summary still counts them all.
const MaxResults = 1000

// Labels mark the Reports gpuguard owns, so that stale ones can be found.
var Labels = wellknown.OwnedLabels(wellknown.ComponentAudit)

// Build makes one Report per namespace that holds a judged object: a fail
// result per violation of a denied object, a warn result per violation of an
// object the mode only warns about, and the count of passing objects in the
// summary. Namespaces with nothing judged get no Report.
func Build(out audit.Outcome, now time.Time) map[string]*openreports.Report {
	byNS := map[string]*openreports.Report{}
	ts := metav1.Timestamp{Seconds: now.Unix()}
	for _, j := range out.Judged {
		ns := j.Meta.GetNamespace()
		r := byNS[ns]
		if r == nil {
			r = newReport(ns)
			byNS[ns] = r
		}
		if len(j.Result.Violations) == 0 {
			r.Summary.Pass++
			continue
		}
		verdict := openreports.Result("fail")
		if j.Result.Allowed {
			verdict = "warn"
		}
		for _, v := range j.Result.Violations {
			r.Results = append(r.Results, result(j, v, verdict, ts))
			if verdict == "fail" {
				r.Summary.Fail++
			} else {
				r.Summary.Warn++
			}
		}
	}
	for _, r := range byNS {
		sort.SliceStable(r.Results, func(a, b int) bool { return subjectKey(r.Results[a]) < subjectKey(r.Results[b]) })
		if len(r.Results) > MaxResults {
			r.Results = r.Results[:MaxResults]
			r.Configuration = &openreports.ReportConfiguration{Limits: openreports.Limits{MaxResults: MaxResults}}
		}
	}
	return byNS
}

func newReport(ns string) *openreports.Report {
	return &openreports.Report{
		TypeMeta:   metav1.TypeMeta{APIVersion: openreports.SchemeGroupVersion.String(), Kind: "Report"},
		ObjectMeta: metav1.ObjectMeta{Name: Name, Namespace: ns, Labels: Labels},
		Source:     wellknown.AuditReportSource,
		Results:    []openreports.ReportResult{},
	}
}

// result names the rule, the object, the container and the fix.
func result(j audit.Judged, v policy.Violation, verdict openreports.Result, ts metav1.Timestamp) openreports.ReportResult {
	props := map[string]string{"path": v.Path, "mode": string(j.Result.Mode)}
	if v.Container != "" {
		props["container"] = v.Container
	}
	return openreports.ReportResult{
		Source: wellknown.AuditReportSource, Policy: wellknown.ReportPolicy, Rule: string(v.Rule), Category: "GPU isolation",
		Severity: "high", Result: verdict, Timestamp: ts, Scored: true,
		Subjects: []corev1.ObjectReference{{APIVersion: j.APIVersion, Kind: j.Kind, Namespace: j.Meta.GetNamespace(),
			Name: j.Meta.GetName(), UID: j.Meta.GetUID()}},
		Description: fmt.Sprintf("%s (%s)", v.Message, v.Path),
		Properties:  props,
	}
}

func subjectKey(r openreports.ReportResult) string {
	var b strings.Builder
	for _, s := range r.Subjects {
		b.WriteString(s.Kind + "/" + s.Name + "/")
	}
	return b.String() + r.Rule
}
