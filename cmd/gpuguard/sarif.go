package main

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/gpuguard/gpuguard/internal/manifest"
	"github.com/gpuguard/gpuguard/policy"
)

// SARIF 2.1.0, the subset code-scanning services read: one run, the rules of
// the registry, and one result per violation (error) and warning.
type sarifLog struct {
	Schema  string     `json:"$schema"`
	Version string     `json:"version"`
	Runs    []sarifRun `json:"runs"`
}

type sarifRun struct {
	Tool        sarifTool         `json:"tool"`
	Invocations []sarifInvocation `json:"invocations"`
	Results     []sarifResult     `json:"results"`
}

// sarifInvocation says whether the run judged all its input: an input that
// could not be judged makes it unsuccessful, with a notification each, so
// that a failed run never uploads as a clean scan.
type sarifInvocation struct {
	ExecutionSuccessful bool                `json:"executionSuccessful"`
	Notifications       []sarifNotification `json:"toolExecutionNotifications,omitempty"`
}

type sarifNotification struct {
	Level     string          `json:"level"`
	Message   sarifMessage    `json:"message"`
	Locations []sarifLocation `json:"locations,omitempty"`
}

type sarifTool struct {
	Driver sarifDriver `json:"driver"`
}

type sarifDriver struct {
	Name           string      `json:"name"`
	Version        string      `json:"version,omitempty"`
	InformationURI string      `json:"informationUri"`
	Rules          []sarifRule `json:"rules"`
}

// sarifRule is a rule as GitHub code scanning shows it: its help, its
// default level, and properties.security-severity (0.1-10), which sets the
// alert's severity, with its tags.
type sarifRule struct {
	ID                   string            `json:"id"`
	Name                 string            `json:"name,omitempty"`
	ShortDescription     sarifMessage      `json:"shortDescription"`
	FullDescription      sarifMessage      `json:"fullDescription"`
	Help                 sarifHelp         `json:"help"`
	HelpURI              string            `json:"helpUri"`
	DefaultConfiguration sarifRuleConfig   `json:"defaultConfiguration"`
	Properties           sarifRuleProperty `json:"properties"`
}

type sarifHelp struct {
	Text     string `json:"text"`
	Markdown string `json:"markdown"`
}

type sarifRuleConfig struct {
	Level string `json:"level"`
}

type sarifRuleProperty struct {
	SecuritySeverity string   `json:"security-severity"`
	Tags             []string `json:"tags"`
	Precision        string   `json:"precision"`
}

type sarifMessage struct {
	Text string `json:"text"`
}

type sarifResult struct {
	RuleID    string          `json:"ruleId"`
	Level     string          `json:"level"`
	Message   sarifMessage    `json:"message"`
	Locations []sarifLocation `json:"locations,omitempty"`
}

type sarifLocation struct {
	Physical sarifPhysical `json:"physicalLocation"`
}

type sarifPhysical struct {
	Artifact sarifArtifact `json:"artifactLocation"`
	Region   sarifRegion   `json:"region"`
}

type sarifArtifact struct {
	URI string `json:"uri"`
}

type sarifRegion struct {
	StartLine int `json:"startLine"`
}

const sarifSchema = "https://json.schemastore.org/sarif-2.1.0.json"

// rulesURI documents every rule (the rule table of docs/policy.md, whose
// rows have no anchors of their own).
const rulesURI = "https://github.com/gpuguard/gpuguard/blob/main/docs/policy.md#rules"

// stdinURI locates results of documents read from standard input: SARIF
// consumers need a location, and a pipe has no file name.
const stdinURI = "stdin"

// sarifVersion is the driver's version as SARIF wants it, starting with a
// number so that viewers can compare versions ("v0.3.1" is "0.3.1"); a
// development build, which has none, states none.
func sarifVersion(v string) string {
	v = strings.TrimPrefix(v, "v")
	if v == "" || v[0] < '0' || v[0] > '9' {
		return ""
	}
	return v
}

// sarifRuleName is a rule's name for people, distinct from its stable id
// as SARIF requires (3.49.7): "sensitive-hostpath" is SensitiveHostpath;
// a one-word id ("privileged") has no other name, and SARIF then wants
// none.
func sarifRuleName(id policy.RuleID) string {
	var b strings.Builder
	for word := range strings.SplitSeq(string(id), "-") {
		if word != "" {
			b.WriteString(strings.ToUpper(word[:1]) + word[1:])
		}
	}
	if strings.EqualFold(b.String(), string(id)) {
		return ""
	}
	return b.String()
}

// writeSARIF writes results as SARIF: each violation an error and each
// warning a warning, located at the field's line where the object came
// from a file.
func writeSARIF(w io.Writer, results []checkedObject) error {
	run := sarifRun{Tool: sarifTool{Driver: sarifDriver{Name: "gpuguard", Version: sarifVersion(buildVersion()),
		InformationURI: "https://github.com/gpuguard/gpuguard"}}, Results: []sarifResult{}}
	for _, r := range policy.Registry() {
		run.Tool.Driver.Rules = append(run.Tool.Driver.Rules, sarifRuleOf(r))
	}
	inv := sarifInvocation{ExecutionSuccessful: true}
	for _, o := range results {
		if o.Error != "" {
			inv.ExecutionSuccessful = false
			n := sarifNotification{Level: "error", Message: sarifMessage{o.Error}}
			if o.Source != "" {
				n.Locations = []sarifLocation{location(o.Source, o.Line)}
			}
			inv.Notifications = append(inv.Notifications, n)
			continue
		}
		// Each document is parsed for its field lines once, not once a finding.
		var lineOf func(string) int
		if o.doc != nil && len(o.Violations)+len(o.Warnings) > 0 {
			lineOf = o.doc.FieldLines()
		}
		for _, v := range o.Violations {
			run.Results = append(run.Results, sarifResultOf(o, lineOf, v.Rule, "error", v.String(), v.Path))
		}
		for _, wn := range o.Warnings {
			run.Results = append(run.Results, sarifResultOf(o, lineOf, wn.Rule, "warning", wn.Path+" ["+string(wn.Rule)+"]: "+wn.Message, wn.Path))
		}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	run.Invocations = []sarifInvocation{inv}
	return enc.Encode(sarifLog{Schema: sarifSchema, Version: "2.1.0", Runs: []sarifRun{run}})
}

// sarifRuleOf describes a rule: its summary (the rule table's line) as
// its descriptions and help, its default effect as level and severity.
func sarifRuleOf(r *policy.Rule) sarifRule {
	level, severity := "error", "8.0" // a denial: a container reaching GPUs it was not given
	switch s := strings.ToLower(r.Summary); {
	case strings.HasPrefix(s, "(mutation)"):
		level, severity = "note", "2.0"
	case strings.HasPrefix(s, "advisory"), strings.HasPrefix(s, "(warning)"), strings.HasPrefix(s, "warning"):
		level, severity = "warning", "4.0"
	}
	plain := strings.ReplaceAll(r.Summary, "`", "")
	md := "**" + string(r.ID) + "**: " + r.Summary + "\n\n"
	if r.Gap != "" {
		md += "The CEL backstop: " + r.Gap + "\n\n"
	}
	md += "See [the rule table](" + rulesURI + ") and `gpuguard rules`."
	return sarifRule{
		ID: string(r.ID), Name: sarifRuleName(r.ID),
		ShortDescription:     sarifMessage{string(r.ID) + ": " + firstClause(plain)},
		FullDescription:      sarifMessage{plain},
		Help:                 sarifHelp{Text: plain + " See " + rulesURI, Markdown: md},
		HelpURI:              rulesURI,
		DefaultConfiguration: sarifRuleConfig{Level: level},
		Properties: sarifRuleProperty{SecuritySeverity: severity, Precision: "very-high",
			Tags: []string{"security", "kubernetes", "gpu", "gpuguard"}},
	}
}

// firstClause is a summary up to its first semicolon, for a short description.
func firstClause(s string) string {
	if i := strings.Index(s, ";"); i > 0 {
		return s[:i]
	}
	return s
}

// location is a file and line, standard input named stdinURI.
func location(source string, line int) sarifLocation {
	if source == manifest.StdinName {
		source = stdinURI
	}
	source = artifactURI(source)
	if line < 1 {
		line = 1
	}
	return sarifLocation{Physical: sarifPhysical{Artifact: sarifArtifact{URI: source}, Region: sarifRegion{StartLine: line}}}
}

// sarifResultOf is one finding; lineOf locates it in its file, nil for an
// object read from standard input or from a cluster.
func sarifResultOf(o checkedObject, lineOf func(string) int, rule policy.RuleID, level, text, path string) sarifResult {
	r := sarifResult{RuleID: string(rule), Level: level, Message: sarifMessage{o.Kind + " " + o.Namespace + "/" + o.Name + ": " + text}}
	if lineOf != nil {
		r.Locations = []sarifLocation{location(o.doc.Source, lineOf(path))}
	}
	return r
}

// artifactURI is a file as code scanning locates it: relative to the
// working directory (the repository's root in CI) where it lies below it,
// with forward slashes; a kustomization's output is its directory.
func artifactURI(source string) string {
	source = strings.TrimSuffix(source, " (kustomize build)")
	if filepath.IsAbs(source) {
		if wd, err := os.Getwd(); err == nil {
			if rel, err := filepath.Rel(wd, source); err == nil && !strings.HasPrefix(rel, "..") {
				source = rel
			}
		}
	}
	return filepath.ToSlash(source)
}
