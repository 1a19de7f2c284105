package reports

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/internal/audit"
	"github.com/gpuguard/gpuguard/internal/wellknown"
	"github.com/gpuguard/gpuguard/policy"
)

func judged(ns, name string, allowed bool, violations ...policy.Violation) audit.Judged {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: "uid-" + "name"}}
	return audit.Judged{Object: audit.Object{Kind: "Pod", APIVersion: "v1", Obj: pod, Meta: pod},
		Result: policy.Result{Allowed: allowed, Mode: config.ModeEnforce, Violations: violations}}
}

func TestBuild(t *testing.T) {
	finalState := policy.Violation{Path: "spec.containers[0].env", Rule: policy.RuleFinalState, Container: "app", Message: `container "app" has no GPU limit and no NVIDIA_VISIBLE_DEVICES=void`}
	deviceEnv := policy.Violation{Path: "spec.containers[0].env[0]", Rule: policy.RuleDeviceEnv, Container: "app", Message: "sets NVIDIA_VISIBLE_DEVICES=all"}
	out := audit.Outcome{Judged: []audit.Judged{
		judged("team-a", "leak", false, finalState),
		judged("team-a", "ok", true),
		judged("team-b", "warned", true, deviceEnv),
		judged("team-c", "ok", true),
	}}
	got := Build(out, time.Unix(1700000000, 0))
	if len(got) != 3 {
		t.Fatalf("want a Report for each of the 3 namespaces, got %d", len(got))
	}
	a := got["team-a"]
	if a.Name != Name || a.Namespace != "team-a" || a.Source != wellknown.AuditReportSource || a.Labels["app.kubernetes.io/managed-by"] != "gpuguard" {
		t.Errorf("report meta %+v", a.ObjectMeta)
	}
	if a.Summary.Pass != 1 || a.Summary.Fail != 1 || len(a.Results) != 1 {
		t.Fatalf("team-a summary %+v, %d results; want 1 pass, 1 fail", a.Summary, len(a.Results))
	}
	r := a.Results[0]
	if r.Rule != "final-state" || r.Result != "fail" || r.Policy != wellknown.ReportPolicy || r.Subjects[0].Name != "leak" ||
		r.Properties["container"] != "app" || r.Properties["path"] != finalState.Path || r.Timestamp.Seconds != 1700000000 {
		t.Errorf("result %+v", r)
	}
	if b := got["team-b"]; b.Summary.Warn != 1 || b.Results[0].Result != "warn" {
		t.Errorf("an allowed object's violations are warnings: %+v", b.Summary)
	}
	if c := got["team-c"]; c.Summary.Pass != 1 || len(c.Results) != 0 {
		t.Errorf("a namespace with only passing objects: %+v", c.Summary)
	}
}

func TestBuildBoundsAReport(t *testing.T) {
	v := policy.Violation{Path: "spec.containers[0].env", Rule: policy.RuleFinalState, Container: "app", Message: "no void"}
	var out audit.Outcome
	for i := range MaxResults + 5 {
		out.Judged = append(out.Judged, judged("big", fmt.Sprintf("pod-%d", i), false, v))
	}
	r := Build(out, time.Unix(0, 0))["big"]
	if len(r.Results) != MaxResults || r.Summary.Fail != MaxResults+5 || r.Configuration == nil || r.Configuration.Limits.MaxResults != MaxResults {
		t.Errorf("%d results, summary %+v, configuration %+v", len(r.Results), r.Summary, r.Configuration)
	}
}
