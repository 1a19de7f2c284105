package cli

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
	Tool    sarifTool     `json:"tool"`
	Results []sarifResult `json:"results"`
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

// writeSARIF writes results as SARIF: each violation an error and each
// warning a warning, located at the field's line where the object came
// from a file.
func writeSARIF(w io.Writer, results []checkedObject) error {
	run := sarifRun{Tool: sarifTool{Driver: sarifDriver{Name: "gpuguard", Version: buildVersion(),
		InformationURI: "https://github.com/gpuguard/gpuguard"}}, Results: []sarifResult{}}
	for _, r := range policy.Registry() {
		run.Tool.Driver.Rules = append(run.Tool.Driver.Rules, sarifRule{ID: string(r.ID), ShortDescription: sarifMessage{r.Summary}})
	}
	for _, o := range results {
		// Each document is parsed for its field lines once, not once a finding.
		var lineOf func(string) int
		if o.doc != nil && o.doc.Source != manifest.StdinName && len(o.Violations)+len(o.Warnings) > 0 {
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
	return enc.Encode(sarifLog{Schema: sarifSchema, Version: "2.1.0", Runs: []sarifRun{run}})
}

// sarifResultOf is one finding; lineOf locates it in its file, nil for an
// object read from standard input or from a cluster.
func sarifResultOf(o checkedObject, lineOf func(string) int, rule policy.RuleID, level, text, path string) sarifResult {
	r := sarifResult{RuleID: string(rule), Level: level, Message: sarifMessage{o.Kind + " " + o.Namespace + "/" + o.Name + ": " + text}}
	if lineOf != nil {
		r.Locations = []sarifLocation{{Physical: sarifPhysical{
			Artifact: sarifArtifact{URI: o.doc.Source}, Region: sarifRegion{StartLine: lineOf(path)}}}}
	}
	return r
}
