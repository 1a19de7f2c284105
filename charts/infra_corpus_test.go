//go:build upstream

package charts

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/policy"
	"github.com/gpuguard/gpuguard/tools/upstreamchart"
)

// infraProject is node infrastructure that mounts host paths: a chart
// rendered at a pinned version, or, where the Go module proxy does not serve
// the project, a manifest in testdata/infra shaped from its chart.
type infraProject struct {
	name   string
	source upstreamchart.Source
	shaped string // testdata/infra file, when there is no source
	ns     string
	values map[string]any
	// denied is, per workload ("Kind/name"), the rules that deny it under
	// the default policy. A workload not listed is admitted.
	denied map[string][]policy.RuleID
	// fix is how the project's denied workloads are admitted: fixNamespace
	// or fixExempt.
	fix string
}

const (
	// fixNamespace: the chart keeps the project's namespace out of the
	// webhooks' and the backstop's sight by default.
	fixNamespace = "excluded by the chart's defaults"
	// fixExempt: the denied workloads' service accounts are exempted.
	fixExempt = "exempt its service accounts"
	// fixScopeLogs: /var/log, which the runtime's container logs lie in, is
	// a data directory scoped to the denied workloads' service accounts.
	fixScopeLogs = "scope `/var/log` to its service accounts (`writableHostPaths`)"
)

func grafanaChart(dir string) upstreamchart.Source {
	return upstreamchart.Source{Module: "github.com/grafana/helm-charts", Version: "v0.0.0-20260820194520-7a0ab968961a",
		Sum: "h1:cNDOtfJLumgS6a39wrg99KHg2xC/rQ1YeHpTWz40qws=", Dir: "charts/" + dir}
}

func istioChart(dir string) upstreamchart.Source {
	return upstreamchart.Source{Module: "github.com/istio/istio", Version: "v0.0.0-20260907190003-78a8ed366225",
		Sum: "h1:oQXRoV5Zf+xgbyPukwnzyVHLdANCRWnWASJTHKwPMtA=", Dir: "manifests/charts/" + dir}
}

// infraProjects: log shippers, storage, CNI and mesh agents, runtime
// security and monitoring agents, as they install by default.
func infraProjects() []infraProject {
	hp, priv, caps, ns, link := policy.RuleSensitiveHostPath, policy.RulePrivileged, policy.RuleAddedCapabilities, policy.RuleNamespaceEntry, policy.RuleHostPathLink
	hostNet := policy.RuleHostNetworkIPC
	return []infraProject{
		// Fluent Bit keeps its position database in /var/log, read-write
		// as root: beside the container logs the runtime opens as root.
		{name: "Fluent Bit (Grafana's chart)", source: grafanaChart("fluent-bit"), ns: "logging",
			denied: map[string][]policy.RuleID{"DaemonSet/fluent-bit-fluent-bit-loki": {hp}}, fix: fixScopeLogs},
		{name: "Fluent Bit", shaped: "fluent-bit.yaml", ns: "logging",
			denied: map[string][]policy.RuleID{"DaemonSet/fluent-bit": {hp}}, fix: fixScopeLogs},
		{name: "Promtail", source: grafanaChart("promtail"), ns: "logging"},
		// Vector's chart mounts /var/lib read-only as root: every pod's
		// volumes and tokens under /var/lib/kubelet.
		{name: "Vector", shaped: "vector.yaml", ns: "logging",
			denied: map[string][]policy.RuleID{"DaemonSet/vector": {ns, hp}}, fix: fixExempt},
		{name: "local-path-provisioner", ns: "local-path-storage", source: upstreamchart.Source{Module: "github.com/rancher/local-path-provisioner",
			Version: "v0.0.30", Sum: "h1:OkiuofkCSscddl7tma/B9Ox1wu+JEVSrP7IcZI65Ggo=", Dir: "deploy/chart/local-path-provisioner"}},
		{name: "AWS EBS CSI driver", ns: "aws-ebs-csi", source: upstreamchart.Source{Module: "github.com/kubernetes-sigs/aws-ebs-csi-driver",
			Version: "v1.44.0", Sum: "h1:BETHuC7vLYnNZXYe4T0zj/IuPx40s7yvpULm4EJO0PQ=", Dir: "charts/aws-ebs-csi-driver"},
			denied: map[string][]policy.RuleID{"DaemonSet/ebs-csi-node": {link, priv, hp}}, fix: fixExempt},
		{name: "Longhorn", shaped: "longhorn.yaml", ns: "longhorn-system",
			denied: map[string][]policy.RuleID{"DaemonSet/longhorn-manager": {ns, priv, hp}, "DaemonSet/longhorn-csi-plugin": {link, priv, hp}}, fix: fixExempt},
		{name: "Cilium", ns: "kube-system", source: upstreamchart.Source{Module: "github.com/cilium/cilium",
			Version: "v1.20.2", Sum: "h1:dqiEGIcXc+gqCLYG/l7VCFJ8GHyb4HUrwbZOpkX5dL8=", Dir: "install/kubernetes/cilium"},
			denied: map[string][]policy.RuleID{"DaemonSet/cilium": {caps, hostNet, link, ns, priv, hp}, "DaemonSet/cilium-envoy": {caps, hostNet, hp},
				"Deployment/cilium-operator": {hostNet}}, fix: fixNamespace},
		{name: "Calico", ns: "calico-system", source: upstreamchart.Source{Module: "github.com/projectcalico/calico",
			Version: "v1.11.0-cni-plugin.0.20250813170300-a0db560f0520", Sum: "h1:TXnPEzx4pLWgwzCetIO/VJuz4iBZZrOdNSv16a50YqE=", Dir: "charts/calico"},
			denied: map[string][]policy.RuleID{"DaemonSet/calico-node": {hostNet, link, ns, priv, hp}}, fix: fixNamespace},
		{name: "Istio CNI", source: istioChart("istio-cni"), ns: "istio-system",
			denied: map[string][]policy.RuleID{"DaemonSet/istio-cni-node": {caps, ns, hp}}, fix: fixExempt},
		{name: "Istio ztunnel", source: istioChart("ztunnel"), ns: "istio-system",
			denied: map[string][]policy.RuleID{"DaemonSet/ztunnel": {caps, hp}}, fix: fixExempt},
		{name: "Falco", shaped: "falco.yaml", ns: "falco",
			denied: map[string][]policy.RuleID{"DaemonSet/falco": {link, ns, priv, hp}}, fix: fixExempt},
		{name: "Datadog agent", shaped: "datadog.yaml", ns: "datadog",
			denied: map[string][]policy.RuleID{"DaemonSet/datadog": {ns, hp}}, fix: fixExempt},
	}
}

// infraPods renders or reads a project's manifests into the pods its
// workloads would create, by "Kind/name".
func infraPods(t *testing.T, p infraProject) map[string]*corev1.Pod {
	t.Helper()
	if p.shaped == "" {
		return corpusPods(t, corpusSource{name: releaseOf(p), source: p.source, ns: p.ns, values: p.values})
	}
	data, err := os.ReadFile(filepath.Join("testdata", "infra", p.shaped))
	if err != nil {
		t.Fatal(err)
	}
	pods := map[string]*corev1.Pod{}
	for doc := range strings.SplitSeq(string(data), "\n---") {
		addTemplates(t, pods, "", []byte(doc))
	}
	return pods
}

// releaseOf names a project's release as its README installs it: after its
// chart's directory.
func releaseOf(p infraProject) string {
	return filepath.Base(p.source.Dir)
}

// TestInfrastructureCorpus: the node infrastructure of infraProjects, as it
// installs by default, is denied by exactly the rules listed and admitted
// otherwise; the listed fix admits every workload of the project, and an
// exemption admits nothing else (another service account of the namespace,
// the same pods in a tenant's namespace). docs/compatibility.md carries
// the table this test writes with -update.
func TestInfrastructureCorpus(t *testing.T) {
	gg := loadChart(t)
	engine, err := policy.New(config.Default())
	if err != nil {
		t.Fatal(err)
	}
	excluded := chartExcludedNamespaces(t, gg.Values)
	var rows []string
	for _, p := range infraProjects() {
		t.Run(p.name, func(t *testing.T) {
			pods := infraPods(t, p)
			if len(pods) == 0 {
				t.Fatalf("%s gave no workload", p.name)
			}
			var accounts []any
			for _, name := range slices.Sorted(maps.Keys(pods)) {
				pod := pods[name]
				sa := pod.Spec.ServiceAccountName
				got := deniedBy(t, engine, pod, p.ns, sa)
				if want := p.denied[name]; !slices.Equal(got, want) {
					t.Errorf("%s: denied by %v, want %v", name, got, want)
				}
				if len(got) > 0 {
					accounts = append(accounts, map[string]any{"namespace": p.ns, "name": sa})
				}
				rows = append(rows, infraRow(p, name, got))
			}
			for name := range p.denied {
				if pods[name] == nil {
					t.Errorf("%s rendered no %s: the test's expectations are out of date", p.name, name)
				}
			}
			checkInfraFix(t, gg, engine, p, pods, accounts, excluded)
		})
	}
	checkDocTable(t, "../docs/compatibility.md", "infrastructure-corpus", strings.Join(rows, "\n"))
}

// deniedBy lists the rules that deny pod, listed or omitted, sorted.
func deniedBy(t *testing.T, e *policy.Engine, pod *corev1.Pod, ns, sa string) []policy.RuleID {
	t.Helper()
	var rules []policy.RuleID
	r := admit(t, e, pod, ns, sa)
	for _, v := range r.Violations {
		if !slices.Contains(rules, v.Rule) {
			rules = append(rules, v.Rule)
		}
	}
	// A pod with more than policy.MaxFindings findings lists only the
	// first; the rules of the rest deny it all the same.
	for _, rule := range r.OmittedRules {
		if !slices.Contains(rules, rule) {
			rules = append(rules, rule)
		}
	}
	slices.Sort(rules)
	return rules
}

// checkInfraFix: the project's fix admits all its workloads, and no more.
func checkInfraFix(t *testing.T, gg *chart.Chart, without *policy.Engine, p infraProject, pods map[string]*corev1.Pod,
	accounts []any, excluded []string) {
	t.Helper()
	switch p.fix {
	case "":
		if len(p.denied) > 0 {
			t.Errorf("%s has denied workloads but no fix", p.name)
		}
	case fixNamespace:
		if !slices.Contains(excluded, p.ns) {
			t.Errorf("%s: namespace %s is not among the chart's excluded namespaces %v", p.name, p.ns, excluded)
		}
	case fixExempt, fixScopeLogs:
		values := map[string]any{"policy": map[string]any{"spec": map[string]any{"exemptions": map[string]any{"serviceAccounts": accounts}}}}
		if p.fix == fixScopeLogs {
			var writable []any
			for _, w := range config.Default().Spec.WritableHostPaths {
				writable = append(writable, w.Path)
			}
			writable = append(writable, map[string]any{"path": "/var/log", "serviceAccounts": accounts})
			values = map[string]any{"policy": map[string]any{"spec": map[string]any{"writableHostPaths": writable}}}
		}
		with, err := policy.New(renderedEnforcingPolicy(t, gg, values))
		if err != nil {
			t.Fatal(err)
		}
		for name, pod := range pods {
			sa := pod.Spec.ServiceAccountName
			if got := deniedBy(t, with, pod, p.ns, sa); len(got) > 0 {
				t.Errorf("%s with its service account exempt: still denied by %v", name, got)
			}
			for _, attack := range []struct{ ns, sa string }{{"tenant", sa}, {p.ns, "intruder"}} {
				if got, want := deniedBy(t, with, pod, attack.ns, attack.sa), deniedBy(t, without, pod, attack.ns, attack.sa); !slices.Equal(got, want) {
					t.Errorf("%s in %s as %s with the exemption: denied by %v, want %v as without it", name, attack.ns, attack.sa, got, want)
				}
			}
		}
	default:
		t.Fatalf("%s: unknown fix %q", p.name, p.fix)
	}
}

// chartExcludedNamespaces: the namespaces the chart's default values keep
// from the webhooks, besides the release's own.
func chartExcludedNamespaces(t *testing.T, values map[string]any) []string {
	t.Helper()
	ns := []string{"kube-system", "kube-node-lease"}
	admission, _ := values["admission"].(map[string]any)
	list, ok := admission["systemNamespaces"].([]any)
	if !ok {
		t.Fatal("the chart's values have no admission.systemNamespaces list")
	}
	for _, n := range list {
		ns = append(ns, fmt.Sprint(n))
	}
	return ns
}

// infraRow is one line of the compatibility table.
func infraRow(p infraProject, workload string, denied []policy.RuleID) string {
	from := "`" + p.source.Module + "@" + p.source.Version + "`"
	if p.shaped != "" {
		from = "shaped from its chart: `testdata/infra/" + p.shaped + "`"
	}
	result, fix := "admitted", "none"
	if len(denied) > 0 {
		names := make([]string, len(denied))
		for i, r := range denied {
			names[i] = "`" + string(r) + "`"
		}
		result, fix = "denied: "+strings.Join(names, ", "), p.fix
	}
	return fmt.Sprintf("| %s | %s | `%s` in `%s` | %s | %s |", p.name, from, workload, p.ns, result, fix)
}

// checkDocTable: the rows between doc's markers named marker are rows;
// with -update it writes them.
func checkDocTable(t *testing.T, doc, marker, rows string) {
	t.Helper()
	data, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	begin, end := "<!-- "+marker+":begin -->\n", "<!-- "+marker+":end -->"
	i, j := strings.Index(string(data), begin), strings.Index(string(data), end)
	if i < 0 || j < i {
		t.Fatalf("%s has no %q … %q markers", doc, begin, end)
	}
	have := string(data[i+len(begin) : j])
	want := rows + "\n"
	if have == want {
		return
	}
	if *update {
		out := string(data[:i+len(begin)]) + want + string(data[j:])
		if err := os.WriteFile(doc, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s's %s table is out of date: run go test -tags upstream ./charts -run TestInfrastructureCorpus -update", doc, marker)
}
