package main

import (
	"encoding/json"
	"io"

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
	Version        string      `json:"version"`
	InformationURI string      `json:"informationUri"`
	Rules          []sarifRule `json:"rules"`
}

type sarifRule struct {
	ID               string       `json:"id"`
	ShortDescription sarifMessage `json:"shortDescription"`
	HelpURI          string       `json:"helpUri"`
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

// rulesURI documents every rule (the rule table of docs/policy.md).
const rulesURI = "https://github.com/gpuguard/gpuguard/blob/main/docs/policy.md#rules"

// stdinURI locates results of documents read from standard input: SARIF
// consumers need a location, and a pipe has no file name.
const stdinURI = "stdin"

// writeSARIF writes results as SARIF: each violation an error and each
// warning a warning, located at the field's line where the object came
// from a file.
func writeSARIF(w io.Writer, results []checkedObject) error {
	run := sarifRun{Tool: sarifTool{Driver: sarifDriver{Name: "gpuguard", Version: buildVersion(),
		InformationURI: "https://github.com/gpuguard/gpuguard"}}, Results: []sarifResult{}}
	for _, r := range policy.Registry() {
		run.Tool.Driver.Rules = append(run.Tool.Driver.Rules, sarifRule{ID: string(r.ID), ShortDescription: sarifMessage{r.Summary}, HelpURI: rulesURI})
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

// location is a file and line, standard input named stdinURI.
func location(source string, line int) sarifLocation {
	if source == manifest.StdinName {
		source = stdinURI
	}
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
