package charts

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/gpuguard/gpuguard/tools/chartrender"
)

// exportedMetrics are the metric names the binaries declare, read from their
// sources, so that an alert or a panel on a renamed or misspelt metric fails
// here rather than stay silent in production.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	declared := regexp.MustCompile(`(?:Name:\s*|NewDesc\()"(gpuguard_[a-z_]+)"`)
	names := map[string]bool{"up": true}
	for _, dir := range []string{"../webhook", "../agent", "../internal"} {
		err := filepath.WalkDir(dir, func(path string, _ os.DirEntry, err error) error {
			if err != nil || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			data, err := os.ReadFile(path)
			for _, m := range declared.FindAllStringSubmatch(string(data), -1) {
				names[m[1]] = true
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(names) < 20 {
		t.Fatalf("found only %d metric names in the sources", len(names))
	}
	return names
}

var metricInExpr = regexp.MustCompile(`\b(gpuguard_[a-z_]+|up)\b`)

// checkExpr fails for a PromQL expression on a metric the binaries do not
// export, with unbalanced brackets, or with template text left in it.
func checkExpr(t *testing.T, where, expr string, known map[string]bool) {
	t.Helper()
	for _, m := range metricInExpr.FindAllString(expr, -1) {
		name := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_sum"), "_count")
		if !known[name] {
			t.Errorf("%s: metric %s is not exported by gpuguard: %s", where, m, expr)
		}
	}
	for _, pair := range []string{"()", "{}", "[]"} {
		if strings.Count(expr, pair[:1]) != strings.Count(expr, pair[1:]) {
			t.Errorf("%s: unbalanced %s: %s", where, pair, expr)
		}
	}
	if strings.Contains(expr, "{{") || strings.Contains(expr, "<no value>") {
		t.Errorf("%s: template text left: %s", where, expr)
	}
}

// TestPrometheusRule: the alerts decode strictly into the Prometheus
// Operator's types, cover what operators must hear about, and query only
// metrics gpuguard exports.
func TestPrometheusRule(t *testing.T) {
	c := loadChart(t)
	rule := one[*monitoringv1.PrometheusRule](t, decodeAll(t, docs(renderCaseValues(t, c, caseNamed(t, "observability")), false)))
	if rule.Labels["release"] != "prometheus" {
		t.Errorf("labels %v lack the values' release label", rule.Labels)
	}
	known := exportedMetrics(t)
	var alerts []string
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			checkExpr(t, r.Alert, r.Expr.String(), known)
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("%s: no severity or summary", r.Alert)
			}
			checkRunbook(t, r.Alert, r.Annotations["runbook_url"])
		}
	}
	for _, want := range []string{"GPUGuardWebhookDown", "GPUGuardAdmissionErrors", "GPUGuardPolicyInvalid", "GPUGuardPolicyFallback",
		"GPUGuardDenialsSpike", "GPUGuardCertificateExpiring", "GPUGuardAgentNotServing", "GPUGuardNodeNotHardened", "GPUGuardUnallocatedGPUAccess"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("no alert %s among %v", want, alerts)
		}
	}
	// Off by default: the CRD may not exist.
	if n := len(findAll[*monitoringv1.PrometheusRule](decodeAll(t, docs(renderCaseValues(t, c, cases[0]), false)))); n != 0 {
		t.Errorf("the default rendering has %d PrometheusRules", n)
	}
}

// TestGrafanaDashboard: the dashboard decodes strictly into Grafana's
// dashboard schema (the Grafana Foundation SDK's types) and its panels query
// only metrics gpuguard exports.
func TestGrafanaDashboard(t *testing.T) {
	c := loadChart(t)
	var cm *corev1.ConfigMap
	for _, m := range findAll[*corev1.ConfigMap](decodeAll(t, docs(renderCaseValues(t, c, caseNamed(t, "observability")), false))) {
		if strings.HasSuffix(m.Name, "-dashboard") {
			cm = m
		}
	}
	if cm == nil || cm.Labels["grafana_dashboard"] != "1" {
		t.Fatalf("no dashboard ConfigMap with the sidecar's label: %+v", cm)
	}
	// The sidecar loads the classic dashboard JSON, which is what
	// dashboard.Dashboard describes; dashboardv2 is the newer resource format.
	//lint:ignore SA1019 the classic format is the one provisioned here
	var d dashboard.Dashboard
	if err := d.UnmarshalJSONStrict([]byte(cm.Data["gpuguard.json"])); failed(err) {
		t.Fatalf("the dashboard does not match Grafana's schema: %v", describeBuildErrors(err))
	}
	// The SDK's strict decoding of a panel list drops the panels (its
	// per-panel result is an empty error list it takes for a failure), so
	// each panel is decoded strictly on its own.
	var raw struct{ Panels []json.RawMessage }
	if err := json.Unmarshal([]byte(cm.Data["gpuguard.json"]), &raw); err != nil {
		t.Fatal(err)
	}
	if d.Title == nil || *d.Title != "gpuguard" || len(raw.Panels) < 10 {
		t.Fatalf("dashboard %v with %d panels", d.Title, len(raw.Panels))
	}
	known := exportedMetrics(t)
	for i, rp := range raw.Panels {
		var panel dashboard.Panel
		if err := panel.UnmarshalJSONStrict(rp); failed(err) {
			t.Errorf("panel %d does not match Grafana's schema: %s", i, describeBuildErrors(err))
			continue
		}
		if panel.Title == nil || len(panel.Targets) == 0 {
			t.Errorf("panel %d has no title or no queries", i)
			continue
		}
		for _, target := range panel.Targets {
			// A query is the Prometheus data source's, or an unknown one:
			// read its expression the same way for both.
			data, err := json.Marshal(target)
			if err != nil {
				t.Fatal(err)
			}
			var q struct{ Expr string }
			if err := json.Unmarshal(data, &q); err != nil {
				t.Fatal(err)
			}
			if q.Expr == "" {
				t.Errorf("%s: a query without an expression: %s", *panel.Title, data)
			}
			checkExpr(t, *panel.Title, q.Expr, known)
		}
	}
}

// failed: the SDK returns its error list as an error even when it is empty.
func failed(err error) bool {
	var errs cog.BuildErrors
	if errors.As(err, &errs) {
		return len(errs) > 0
	}
	return err != nil
}

// describeBuildErrors spells out the SDK's errors, whose Error() may be empty.
func describeBuildErrors(err error) string {
	var errs cog.BuildErrors
	if !errors.As(err, &errs) {
		return err.Error()
	}
	var b strings.Builder
	for _, e := range errs {
		fmt.Fprintf(&b, "\n%s: %s", e.Path, e.Message)
	}
	return b.String()
}

// TestNetworkPolicy: the webhook still takes reviews on its port from
// anywhere (the API server cannot be selected by labels), metrics only from
// the peers given, and reaches the API server and DNS.
func TestNetworkPolicy(t *testing.T) {
	c := loadChart(t)
	objs := decodeAll(t, docs(renderCaseValues(t, c, caseNamed(t, "observability")), false))
	np := named[*networkingv1.NetworkPolicy](t, objs, "gpuguard-webhook")
	ctl := named[*networkingv1.NetworkPolicy](t, objs, "gpuguard-controller")
	for _, rule := range ctl.Spec.Ingress {
		for _, p := range rule.Ports {
			if p.Port.IntValue() == 9443 {
				t.Errorf("the controller answers no review: its NetworkPolicy must not open 9443: %+v", ctl.Spec.Ingress)
			}
		}
	}
	if len(ctl.Spec.Egress) != 2 {
		t.Errorf("controller egress: %+v", ctl.Spec.Egress)
	}
	if len(np.Spec.Ingress) != 2 || len(np.Spec.Ingress[0].From) != 0 || np.Spec.Ingress[0].Ports[0].Port.IntValue() != 9443 {
		t.Errorf("the webhook port must stay open to the API server: %+v", np.Spec.Ingress)
	}
	if from := np.Spec.Ingress[1].From; len(from) != 1 || from[0].NamespaceSelector == nil {
		t.Errorf("metrics must be limited to the given peers: %+v", from)
	}
	if len(np.Spec.Egress) != 2 || len(np.Spec.Egress[0].Ports) != 2 {
		t.Errorf("egress: %+v", np.Spec.Egress)
	}
	if n := len(findAll[*networkingv1.NetworkPolicy](decodeAll(t, docs(renderCaseValues(t, c, cases[0]), false)))); n != 0 {
		t.Errorf("the default rendering has %d NetworkPolicies", n)
	}
}

// TestOlderClusters: on Kubernetes 1.28 to 1.30, which the chart declares,
// the agent's read-only host mount goes without recursiveReadOnly (beta and
// on by default only from 1.31), which those API servers would drop or refuse.
func TestOlderClusters(t *testing.T) {
	c := loadChart(t)
	for version, want := range map[string]bool{"v1.28.0": false, "v1.30.4": false, "v1.31.0": true, chartrender.KubeVersion: true} {
		rel, err := chartrender.RenderFor(version, c, releaseName, namespace, parseValues(t, ""), clusterAPIs...)
		if err != nil {
			t.Fatalf("%s: %v", version, err)
		}
		if got := strings.Contains(rel.Raw, "recursiveReadOnly"); got != want {
			t.Errorf("%s: recursiveReadOnly rendered = %v, want %v", version, got, want)
		}
	}
	if _, err := chartrender.RenderFor("v1.27.9", c, releaseName, namespace, parseValues(t, ""), clusterAPIs...); err == nil {
		t.Error("Kubernetes 1.27 accepted, below the chart's kubeVersion")
	}
}

// caseNamed is the render case of that name.
func caseNamed(t *testing.T, name string) renderCase {
	t.Helper()
	i := slices.IndexFunc(cases, func(rc renderCase) bool { return rc.name == name })
	if i < 0 {
		t.Fatalf("no render case %q", name)
	}
	return cases[i]
}

// checkRunbook: an alert's runbook_url points at a section of
// docs/troubleshooting.md that exists, named after the alert.
func checkRunbook(t *testing.T, alert, url string) {
	t.Helper()
	const base = "https://github.com/gpuguard/gpuguard/blob/main/docs/troubleshooting.md#"
	anchor, ok := strings.CutPrefix(url, base)
	if !ok || anchor != strings.ToLower(alert) {
		t.Errorf("%s: runbook_url %q, want %s%s", alert, url, base, strings.ToLower(alert))
		return
	}
	doc, err := os.ReadFile(filepath.Join("..", "docs", "troubleshooting.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "\n### "+alert+"\n") {
		t.Errorf("%s: docs/troubleshooting.md has no section \"### %s\" for its runbook_url", alert, alert)
	}
}
