package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"

	"github.com/spf13/pflag"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/strvals"
	"sigs.k8s.io/yaml"

	"github.com/gpuguard/gpuguard/charts"
	"github.com/gpuguard/gpuguard/config"
)

// chartValues are the Helm values a team installs the chart with: the policy
// the chart renders from them, with the chart's own templates, is the one
// previewed, so that presets, exemptions and modes set in values count as
// they will once installed.
type chartValues struct {
	files []string
	set   []string
	// stdin serves a values file named "-".
	stdin io.Reader
}

// The release the policy is rendered for, as the README installs it.
const (
	chartRelease   = "gpuguard"
	chartNamespace = "gpuguard"
	// policyTemplate is the chart's template of the policy ConfigMap.
	policyTemplate = "templates/configmap-policy.yaml"
)

func (v *chartValues) addFlags(fl *pflag.FlagSet) {
	fl.StringArrayVarP(&v.files, "values", "f", nil, "judge with the policy the Helm chart installs with this values file (- for standard input); repeatable, later files win, as with helm install -f")
	fl.StringArrayVar(&v.set, "set", nil, "a chart value KEY=VALUE, as helm install --set takes it, over the --values files; repeatable")
}

// given says whether any values were named.
func (v *chartValues) given() bool { return len(v.files) > 0 || len(v.set) > 0 }

// source names the policy rendered from the values in messages.
func (v *chartValues) source() string {
	names := make([]string, 0, len(v.files)+1)
	names = append(names, v.files...)
	if len(v.set) > 0 {
		names = append(names, "--set")
	}
	return "the chart's policy for " + strings.Join(names, ", ")
}

// policy renders the chart's policy document from the values, then loads
// it as the webhook would: a usage error names what is wrong.
func (v *chartValues) policy() (*config.Policy, []byte, error) {
	doc, err := v.render()
	if err != nil {
		return nil, nil, &exitError{exitUsage, err.Error()}
	}
	p, err := config.Parse(v.source(), doc)
	if err != nil {
		return nil, nil, &exitError{exitUsage, "the chart renders an invalid policy from the values:\n" + err.Error()}
	}
	return p, doc, nil
}

// render returns the policy document the chart puts in its ConfigMap for
// the values.
func (v *chartValues) render() ([]byte, error) {
	c, err := loadEmbeddedChart()
	if err != nil {
		return nil, err
	}
	vals, err := v.merged()
	if err != nil {
		return nil, err
	}
	top, err := v.renderValues(c, vals)
	if err != nil {
		return nil, err
	}
	out, err := engine.Render(policyTemplateOnly(c), top)
	if err != nil {
		return nil, fmt.Errorf("the chart refuses the values: %v", err)
	}
	return policyFromConfigMap(out[path.Join(c.Name(), policyTemplate)])
}

// merged are the values as helm install merges them: each file over the
// one before, then each --set over the result (so that a list index sets
// one element of a list a file set).
func (v *chartValues) merged() (map[string]any, error) {
	sources, err := v.read()
	if err != nil {
		return nil, err
	}
	vals := map[string]any{}
	for _, s := range sources {
		if s.name != setSource {
			vals = mergeValues(vals, s.values)
		}
	}
	for _, s := range v.set {
		if err := strvals.ParseInto(s, vals); err != nil {
			return nil, fmt.Errorf("--set %q: %v", s, err)
		}
	}
	return vals, nil
}

// setSource names the --set values.
const setSource = "--set"

// valuesSource is one values file, or the --set values together.
type valuesSource struct {
	name   string
	values map[string]any
}

// read parses each values file and the --set values, in the order Helm
// merges them.
func (v *chartValues) read() ([]valuesSource, error) {
	var sources []valuesSource
	for _, f := range v.files {
		data, err := v.readFile(f)
		if err != nil {
			return nil, fmt.Errorf("--values %s: %v", f, err)
		}
		m := map[string]any{}
		if err := yaml.Unmarshal(data, &m); err != nil {
			return nil, fmt.Errorf("--values %s does not parse as YAML values: %v", f, err)
		}
		sources = append(sources, valuesSource{name: "--values " + f, values: m})
	}
	if len(v.set) > 0 {
		m := map[string]any{}
		for _, s := range v.set {
			if err := strvals.ParseInto(s, m); err != nil {
				return nil, fmt.Errorf("--set %q: %v", s, err)
			}
		}
		sources = append(sources, valuesSource{name: setSource, values: m})
	}
	return sources, nil
}

func (v *chartValues) readFile(name string) ([]byte, error) {
	if name == "-" {
		if v.stdin == nil {
			return nil, errors.New("no standard input")
		}
		return io.ReadAll(v.stdin)
	}
	return os.ReadFile(name)
}

// renderValues are the values the templates see, checked against the
// chart's schema. When the merged values fail it, each source is read
// again (merging shares its lists) and checked alone, to name the file
// whose field the schema rejects.
func (v *chartValues) renderValues(c *chart.Chart, vals map[string]any) (chartutil.Values, error) {
	opts := chartutil.ReleaseOptions{Name: chartRelease, Namespace: chartNamespace, Revision: 1, IsInstall: true}
	caps := renderCapabilities()
	top, err := chartutil.ToRenderValues(c, vals, opts, caps)
	if err == nil {
		return top, nil
	}
	sources, rerr := v.read()
	if rerr != nil {
		return nil, rerr
	}
	var named []string
	for _, s := range sources {
		if _, alone := chartutil.ToRenderValues(c, s.values, opts, caps); alone != nil {
			named = append(named, fmt.Sprintf("%s: %v", s.name, schemaProblems(alone)))
		}
	}
	if len(named) == 0 {
		return nil, fmt.Errorf("the values together: %v", schemaProblems(err))
	}
	return nil, errors.New(strings.Join(named, "\n"))
}

// admissionPolicyAPIs are the APIs the chart asks the cluster for before
// it puts KAI's fractions in the policy: they hold the ConfigMap guard.
var admissionPolicyAPIs = []string{
	"admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy",
	"admissionregistration.k8s.io/v1/MutatingAdmissionPolicy",
}

// renderCapabilities are those of a cluster that serves both admission
// policy APIs (Kubernetes 1.36 and later), as helm install sees it there:
// helm template's defaults list group versions only, and would refuse
// KAI's preset on any cluster. On an older one, helm install refuses
// what needs them, and says so; the policy document is the same.
func renderCapabilities() *chartutil.Capabilities {
	caps := chartutil.DefaultCapabilities.Copy()
	caps.APIVersions = append(slices.Clone(caps.APIVersions), admissionPolicyAPIs...)
	return caps
}

// schemaProblem is one line of Helm's schema error: the field, as a JSON
// pointer, and what is wrong with it.
var schemaProblem = regexp.MustCompile(`^-\s*at '([^']*)':\s*(.*)$`)

// schemaProblems rewrites Helm's schema error, whose preamble names no file,
// one problem a line, each naming the field as it is set in values.
func schemaProblems(err error) string {
	_, rest, ok := strings.Cut(err.Error(), "in the following chart(s):\n")
	if !ok {
		return err.Error()
	}
	var lines []string
	for _, line := range strings.Split(strings.TrimSpace(rest), "\n") {
		line = strings.TrimSpace(line)
		switch m := schemaProblem.FindStringSubmatch(line); {
		case m != nil:
			field := strings.ReplaceAll(strings.TrimPrefix(m[1], "/"), "/", ".")
			if field == "" {
				field = "(top level)"
			}
			lines = append(lines, fmt.Sprintf("  %s: %s", field, m[2]))
		case line != "" && !strings.HasSuffix(line, ":"): // not the chart's name
			lines = append(lines, "  "+line)
		}
	}
	return "the chart's values.schema.json rejects:\n" + strings.Join(lines, "\n")
}

// mergeValues merges b over a as helm install merges its -f files: maps
// key by key, anything else replaced. Maps are copied, not shared with b.
func mergeValues(a, b map[string]any) map[string]any {
	out := make(map[string]any, len(a))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		if bm, ok := v.(map[string]any); ok {
			am, _ := out[k].(map[string]any)
			out[k] = mergeValues(am, bm)
			continue
		}
		out[k] = v
	}
	return out
}

// loadEmbeddedChart loads the chart the binary was built with.
func loadEmbeddedChart() (*chart.Chart, error) {
	var files []*loader.BufferedFile
	err := fs.WalkDir(charts.GPUGuard(), ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(charts.GPUGuard(), name)
		files = append(files, &loader.BufferedFile{Name: name, Data: data})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("reading the embedded chart: %v", err)
	}
	c, err := loader.LoadFiles(files)
	if err != nil {
		return nil, fmt.Errorf("loading the embedded chart: %v", err)
	}
	return c, nil
}

// policyTemplateOnly is c with only the policy ConfigMap's template and
// the named templates it includes: the rest of the chart (webhook, agent,
// certificates) has checks of its own on the cluster it is installed in,
// which say nothing about the policy.
func policyTemplateOnly(c *chart.Chart) *chart.Chart {
	only := *c
	only.Templates = nil
	for _, t := range c.Templates {
		if t.Name == policyTemplate || strings.HasPrefix(path.Base(t.Name), "_") {
			only.Templates = append(only.Templates, t)
		}
	}
	return &only
}

// policyFromConfigMap returns the policy document of the rendered policy
// ConfigMap.
func policyFromConfigMap(manifest string) ([]byte, error) {
	if strings.TrimSpace(manifest) == "" {
		return nil, errors.New("the values set policy.create=false: the chart installs no policy ConfigMap (the webhook reads one made elsewhere); preview that document with --policy")
	}
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal([]byte(manifest), &cm); err != nil {
		return nil, fmt.Errorf("the chart's policy ConfigMap does not parse: %v", err)
	}
	doc, ok := cm.Data[config.ConfigMapKey]
	if !ok {
		return nil, fmt.Errorf("the chart's policy ConfigMap has no key %s", config.ConfigMapKey)
	}
	return []byte(doc), nil
}
