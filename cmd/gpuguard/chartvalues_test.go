package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/cli/values"
	"helm.sh/helm/v3/pkg/getter"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/yaml"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/tools/chartrender"
)

// chartSource is the chart directory the binary embeds.
const chartSource = "../../charts/gpuguard"

// teamValues is a team's values file: warn, the GPU Operator's preset (its
// service accounts exempted from the rules it names) and a namespace and a
// service account exempted by hand.
const teamValues = `policy:
  mode: warn
  presets:
    gpuOperator:
      enabled: true
    hami:
      enabled: true
  spec:
    exemptions:
      namespaces: [ml-sandbox]
      serviceAccounts:
        - {namespace: monitoring, name: dcgm, rules: [device-env]}
`

func writeValues(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// runCLI runs the command line and returns its exit status and output.
func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = Run(context.Background(), args, strings.NewReader(""), &out, &errOut)
	return code, out.String(), errOut.String()
}

// chartPolicy is the policy document in the ConfigMap that the chart
// directory renders for these value files and --set values, as helm
// template merges and renders them: the reference the CLI must match.
func chartPolicy(t *testing.T, files, set []string) string {
	t.Helper()
	vals, err := (&values.Options{ValueFiles: files, Values: set}).MergeValues(getter.Providers{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := chartrender.Load(chartSource)
	if err != nil {
		t.Fatal(err)
	}
	// The admission policy APIs of the Kubernetes version rendered for,
	// which the rest of the chart needs too.
	rel, err := chartrender.Render(c, chartRelease, chartNamespace, vals, admissionPolicyAPIs...)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range rel.Manifests {
		var cm corev1.ConfigMap
		if m.Head.Kind != "ConfigMap" || yaml.Unmarshal([]byte(m.Content), &cm) != nil {
			continue
		}
		if doc, ok := cm.Data[config.ConfigMapKey]; ok {
			return doc
		}
	}
	t.Fatal("the chart rendered no policy ConfigMap")
	return ""
}

// TestPolicyValuesIsTheChartsPolicy: policy --values prints, byte for byte,
// the document the chart puts in its policy ConfigMap for the same values,
// presets and exemptions included, merged with later files and --set as
// Helm merges them.
func TestPolicyValuesIsTheChartsPolicy(t *testing.T) {
	team := writeValues(t, "values.yaml", teamValues)
	prod := writeValues(t, "prod.yaml", "policy:\n  presets:\n    hami:\n      enabled: false\n")
	for _, c := range []struct {
		name       string
		files, set []string
		contains   []string
	}{
		{"one file", []string{team}, nil,
			[]string{"mode: warn", "- ml-sandbox", "namespace: gpu-operator", "name: nvidia-driver", "name: dcgm", "nvidia.com/gpumem"}},
		// A list index in --set sets one element of the file's list.
		{"files and --set merged", []string{team, prod}, []string{"policy.mode=enforce", "policy.spec.exemptions.namespaces[1]=ml-scratch"},
			[]string{"mode: enforce", "- ml-sandbox", "- ml-scratch", "namespace: gpu-operator"}},
		// Rendered as for a cluster that serves the admission policy
		// APIs, as the reference is: the chart refuses KAI's preset
		// elsewhere.
		{"KAI preset", nil, []string{"policy.presets.kaiScheduler.enabled=true", "backstop.enabled=true"},
			[]string{"kaiScheduler:", "fractions: true", "system:serviceaccount:kai-scheduler:binder"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := []string{"policy"}
			for _, f := range c.files {
				args = append(args, "--values", f)
			}
			for _, s := range c.set {
				args = append(args, "--set", s)
			}
			code, got, stderr := runCLI(t, args...)
			if code != exitOK {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			if want := chartPolicy(t, c.files, c.set); got != want {
				t.Fatalf("policy %v differs from the chart's ConfigMap:\n%s", args[1:], firstLineDiff(want, got))
			}
			// The values are in it: not the built-in policy, nor a chart
			// rendered without them.
			for _, s := range c.contains {
				if !strings.Contains(got, s) {
					t.Errorf("the policy lacks %q:\n%s", s, got)
				}
			}
		})
	}
	if _, got, _ := runCLI(t, "policy"); got != string(config.DefaultYAML()) {
		t.Error("policy without --values should print the built-in policy")
	}
}

func firstLineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := range max(len(w), len(g)) {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			return "line " + strconv.Itoa(i+1) + ":\n  chart: " + wl + "\n  cli:   " + gl
		}
	}
	return "(equal)"
}

// gpuManifests: a pod outside any exemption that takes every GPU, and the
// GPU Operator's device plugin, which sets the device list itself.
const gpuManifests = `apiVersion: v1
kind: Pod
metadata: {name: miner, namespace: team-a}
spec:
  containers: [{name: app, image: cuda, env: [{name: NVIDIA_VISIBLE_DEVICES, value: all}]}]
---
apiVersion: v1
kind: Pod
metadata: {name: device-plugin, namespace: gpu-operator}
spec:
  serviceAccountName: nvidia-device-plugin
  containers: [{name: plugin, image: k8s-device-plugin, env: [{name: NVIDIA_VISIBLE_DEVICES, value: all}]}]
`

// TestCheckValuesJudgesWithTheChartsPolicy: check --values admits and
// denies as the policy the chart installs with those values: the chart's
// default mode (warn) or the values' mode decides the miner, and the
// preset's exemption admits the device plugin.
func TestCheckValuesJudgesWithTheChartsPolicy(t *testing.T) {
	manifests := writeValues(t, "pods.yaml", gpuManifests)
	operator := writeValues(t, "operator.yaml", "policy:\n  presets:\n    gpuOperator:\n      enabled: true\n")
	for _, c := range []struct {
		name    string
		args    []string
		code    int
		allowed map[string]bool
	}{
		{"built-in policy", nil, exitDenied, map[string]bool{"miner": false, "device-plugin": false}},
		{"the chart's default mode warns", []string{"-f", operator}, exitOK, map[string]bool{"miner": true, "device-plugin": true}},
		{"enforce set over the file, the preset exempts the plugin", []string{"-f", operator, "--set", "policy.mode=enforce"}, exitDenied, map[string]bool{"miner": false, "device-plugin": true}},
		{"--mode over the values", []string{"-f", operator, "--set", "policy.mode=warn", "--mode", "enforce"}, exitDenied, map[string]bool{"miner": false, "device-plugin": true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, out, stderr := runCLI(t, append(append([]string{"check", "-o", "json"}, c.args...), manifests)...)
			if code != c.code {
				t.Fatalf("exit %d, want %d: %s\n%s", code, c.code, stderr, out)
			}
			var results []checkedObject
			if err := json.Unmarshal([]byte(out), &results); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			got := map[string]bool{}
			for _, r := range results {
				got[r.Name] = r.Allowed
			}
			for name, allowed := range c.allowed {
				if got[name] != allowed {
					t.Errorf("%s: allowed %v, want %v (%s)", name, got[name], allowed, out)
				}
			}
		})
	}
	code, out, stderr := runCLI(t, "check", "-f", operator, "--set", "policy.mode=audit")
	if code != exitOK || !strings.Contains(out, "is valid (mode audit)") {
		t.Errorf("check --values without PATH should validate the chart's policy: exit %d, %s%s", code, out, stderr)
	}
}

// TestValuesErrorsNameTheFileAndField: values that do not parse, that the
// chart's schema rejects, or that its templates refuse fail as usage
// errors naming the file and the field, for every command that takes them.
func TestValuesErrorsNameTheFileAndField(t *testing.T) {
	good := writeValues(t, "good.yaml", teamValues)
	broken := writeValues(t, "broken.yaml", "policy: [mode: warn\n")
	typo := writeValues(t, "typo.yaml", "policy:\n  spec:\n    injectVoidd: false\n")
	badMode := writeValues(t, "mode.yaml", "policy:\n  mode: strict\n")
	disagree := writeValues(t, "disagree.yaml", "policy:\n  mode: warn\n  spec: {mode: enforce}\n")
	noPolicy := writeValues(t, "external.yaml", "policy:\n  create: false\n")
	policyFile := writeValues(t, "policy.yaml", string(config.DefaultYAML()))
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"does not parse", []string{"-f", good, "-f", broken}, []string{"--values " + broken, "does not parse"}},
		{"missing", []string{"-f", filepath.Join(t.TempDir(), "missing.yaml")}, []string{"missing.yaml", "no such file"}},
		{"unknown field", []string{"-f", good, "-f", typo}, []string{"--values " + typo, "values.schema.json", "policy.spec: additional properties 'injectVoidd' not allowed"}},
		{"bad enum", []string{"-f", badMode}, []string{"--values " + badMode, "policy.mode: value must be one of"}},
		{"bad --set", []string{"-f", good, "--set", "policy.spec.injectVoidd=false"}, []string{"--set", "policy.spec: additional properties 'injectVoidd'"}},
		{"--set syntax", []string{"--set", "policy.mode"}, []string{`--set "policy.mode"`}},
		{"chart refuses", []string{"-f", disagree}, []string{"the chart refuses the values", "policy.mode and policy.spec.mode disagree"}},
		{"no ConfigMap", []string{"-f", noPolicy}, []string{"policy.create=false", "--policy"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			// check judges a manifest (any: the policy fails first).
			for _, args := range [][]string{append([]string{"policy"}, c.args...), append(append([]string{"check"}, c.args...), policyFile)} {
				code, out, stderr := runCLI(t, args...)
				if code != exitUsage {
					t.Fatalf("%v: exit %d, want %d\n%s%s", args, code, exitUsage, out, stderr)
				}
				for _, w := range c.want {
					if !strings.Contains(stderr, w) {
						t.Errorf("%v: stderr does not say %q:\n%s", args, w, stderr)
					}
				}
			}
		})
	}
	code, _, stderr := runCLI(t, "check", "--policy", policyFile, "-f", good, policyFile)
	if code != exitUsage || !strings.Contains(stderr, "--policy and --values") {
		t.Errorf("--policy with --values: exit %d, %s", code, stderr)
	}
}

// TestAuditModeAndValues: audit --mode judges as a policy in that mode
// would, whatever the live policy's mode; --values judges with the policy
// the chart installs with them.
func TestAuditModeAndValues(t *testing.T) {
	cluster := func(mode string) *fake.Clientset {
		objs := auditCluster()
		warn := strings.Replace(string(config.DefaultYAML()), "mode: enforce", "mode: "+mode, 1)
		objs[0] = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "gpuguard", Name: "gpuguard-policy"},
			Data: map[string]string{config.ConfigMapKey: warn}}
		return fake.NewClientset(objs...)
	}
	audit := func(c *fake.Clientset, mode string, valueFiles ...string) ([]checkedObject, error) {
		t.Helper()
		o := &auditOptions{allNamespaces: true, out: outputOptions{format: "json"}, policyConfigMap: "gpuguard/gpuguard-policy",
			excluded: []string{"kube-system", "kube-node-lease"}, stderr: &bytes.Buffer{}, mode: mode, values: chartValues{files: valueFiles}}
		var out bytes.Buffer
		err := o.audit(context.Background(), c, &out)
		var results []checkedObject
		if out.Len() > 0 {
			if jerr := json.Unmarshal(out.Bytes(), &results); jerr != nil {
				t.Fatalf("%v\n%s", jerr, out.String())
			}
		}
		return results, err
	}
	denied := func(err error) bool {
		var ee *exitError
		return errors.As(err, &ee) && ee.code == exitDenied
	}
	// The live policy warns: audit reports, but denies nothing...
	if _, err := audit(cluster("warn"), ""); err != nil {
		t.Fatalf("the live policy warns, audit should deny nothing: %v", err)
	}
	// ...and --mode enforce shows what enforcing it would deny.
	results, err := audit(cluster("warn"), "enforce")
	if !denied(err) {
		t.Fatalf("--mode enforce: %v, want the denied exit status", err)
	}
	for _, r := range results {
		if r.Mode != config.ModeEnforce {
			t.Errorf("%s %s judged in mode %s, want enforce", r.Kind, r.Name, r.Mode)
		}
	}
	// Down, the other way.
	if _, err := audit(cluster("enforce"), "warn"); err != nil {
		t.Errorf("--mode warn over an enforcing policy: %v, want nothing denied", err)
	}
	var ee *exitError
	if _, err := audit(cluster("enforce"), "strict"); !errors.As(err, &ee) || ee.code != exitUsage || !strings.Contains(ee.msg, `--mode "strict"`) {
		t.Errorf("--mode strict: %v, want a usage error naming --mode", err)
	}
	// --values: the chart's policy with team-a exempted admits what the
	// live enforcing policy denies.
	exempt := writeValues(t, "values.yaml", "policy:\n  spec:\n    exemptions:\n      namespaces: [team-a]\n")
	if _, err := audit(cluster("enforce"), "", exempt); err != nil {
		t.Errorf("--values exempting team-a: %v, want nothing denied", err)
	}
	if _, err := audit(cluster("enforce"), "enforce", exempt); err != nil {
		t.Errorf("--values exempting team-a with --mode enforce: %v, want nothing denied", err)
	}
}

// TestEmbeddedChartIsTheChartDirectory: the binary renders with every
// template and file the chart directory has, as Helm loads it.
func TestEmbeddedChartIsTheChartDirectory(t *testing.T) {
	embedded, err := loadEmbeddedChart()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := chartrender.Load(chartSource)
	if err != nil {
		t.Fatal(err)
	}
	for _, tpl := range dir.Templates {
		i := slices.IndexFunc(embedded.Templates, func(e *chart.File) bool { return e.Name == tpl.Name })
		if i < 0 || !bytes.Equal(embedded.Templates[i].Data, tpl.Data) {
			t.Errorf("template %s is not embedded as it is in the chart directory", tpl.Name)
		}
	}
	if len(embedded.Templates) != len(dir.Templates) {
		t.Errorf("embedded %d templates, the chart directory has %d", len(embedded.Templates), len(dir.Templates))
	}
	if !bytes.Equal(embedded.Schema, dir.Schema) {
		t.Error("the embedded values.schema.json differs from the chart directory's")
	}
	for _, f := range dir.Files {
		i := slices.IndexFunc(embedded.Files, func(e *chart.File) bool { return e.Name == f.Name })
		if i < 0 || !bytes.Equal(embedded.Files[i].Data, f.Data) {
			t.Errorf("file %s is not embedded as it is in the chart directory", f.Name)
		}
	}
}
