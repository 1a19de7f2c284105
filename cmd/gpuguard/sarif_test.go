package main

import (
	"encoding/json"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestSARIFForCodeScanning: the log has what GitHub code scanning requires
// and reads (docs.github.com, "SARIF support for code scanning"): the
// driver's name and rules with ids, help, a default level and a
// security-severity; results with a ruleId of those rules, a level, a
// message, and a location whose artifact URI is relative and whose region
// starts at a line of the file: for a finding inside a custom resource,
// the line of its field, not the document's first.
func TestSARIFForCodeScanning(t *testing.T) {
	file := filepath.Join("testdata", "kinds", "argo.yaml")
	o := &checkOptions{out: outputOptions{format: "sarif", failOn: "deny"}}
	code, stdout, stderr := runCheck(t, o, file)
	if code != exitDenied {
		t.Fatalf("exit %d, want 1\n%s", code, stderr)
	}
	var log struct {
		Runs []struct {
			Tool struct {
				Driver struct {
					Name    string `json:"name"`
					Version string `json:"version"`
					Rules   []struct {
						ID               string `json:"id"`
						Name             string `json:"name"`
						ShortDescription struct{ Text string }
						FullDescription  struct{ Text string }
						Help             struct{ Text, Markdown string }
						HelpURI          string `json:"helpUri"`
						Default          struct {
							Level string `json:"level"`
						} `json:"defaultConfiguration"`
						Properties map[string]any `json:"properties"`
					} `json:"rules"`
				} `json:"driver"`
			} `json:"tool"`
			Results []struct {
				RuleID    string `json:"ruleId"`
				Level     string `json:"level"`
				Message   struct{ Text string }
				Locations []struct {
					Physical struct {
						Artifact struct{ URI string } `json:"artifactLocation"`
						Region   struct {
							StartLine int `json:"startLine"`
						} `json:"region"`
					} `json:"physicalLocation"`
				} `json:"locations"`
			} `json:"results"`
		} `json:"runs"`
	}
	if err := json.Unmarshal([]byte(stdout), &log); err != nil {
		t.Fatal(err)
	}
	if len(log.Runs) != 1 || log.Runs[0].Tool.Driver.Name != "gpuguard" {
		t.Fatalf("want one run of gpuguard:\n%s", stdout)
	}
	if v := log.Runs[0].Tool.Driver.Version; v != "" && (v[0] < '0' || v[0] > '9') {
		t.Errorf("driver version %q does not start with a number", v)
	}
	rules := map[string]bool{}
	for _, r := range log.Runs[0].Tool.Driver.Rules {
		rules[r.ID] = true
		sev, _ := r.Properties["security-severity"].(string)
		f, err := strconv.ParseFloat(sev, 64)
		tags, _ := r.Properties["tags"].([]any)
		switch {
		case r.Name != "" && strings.EqualFold(r.Name, r.ID):
			t.Errorf("rule %s: name %q repeats the id, which SARIF forbids (3.49.7)", r.ID, r.Name)
		case r.ID == "" || r.ShortDescription.Text == "" || r.FullDescription.Text == "" || r.Help.Text == "" || r.Help.Markdown == "":
			t.Errorf("rule %q lacks its descriptions or help", r.ID)
		case !strings.HasPrefix(r.HelpURI, "https://github.com/gpuguard/gpuguard/blob/main/docs/policy.md#"):
			t.Errorf("rule %s: helpUri %q", r.ID, r.HelpURI)
		case r.Default.Level != "error" && r.Default.Level != "warning" && r.Default.Level != "note":
			t.Errorf("rule %s: default level %q", r.ID, r.Default.Level)
		case err != nil || f < 0.1 || f > 10:
			t.Errorf("rule %s: security-severity %q, want 0.1-10", r.ID, sev)
		case !slicesContain(tags, "security"):
			t.Errorf("rule %s: tags %v lack security", r.ID, tags)
		}
	}
	results := log.Runs[0].Results
	if len(results) < 5 {
		t.Fatalf("want a result per denied template of %s, got %d", file, len(results))
	}
	for _, r := range results {
		if !rules[r.RuleID] || r.Level != "error" || r.Message.Text == "" || len(r.Locations) != 1 {
			t.Errorf("result %+v: want a known ruleId, level error, a message and one location", r)
			continue
		}
		loc := r.Locations[0].Physical
		if loc.Artifact.URI != "testdata/kinds/argo.yaml" || filepath.IsAbs(loc.Artifact.URI) {
			t.Errorf("artifact URI %q, want the relative path", loc.Artifact.URI)
		}
		if loc.Region.StartLine <= 1 {
			t.Errorf("%s: line %d, want its field's", r.Message.Text, loc.Region.StartLine)
		}
	}
}

func slicesContain(list []any, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
