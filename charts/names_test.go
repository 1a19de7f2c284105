package charts

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/internal/wellknown"
)

// gpuguardName is any name in gpuguard's own domain: a label, a kind, an API
// version.
var gpuguardName = regexp.MustCompile(`\b` + regexp.QuoteMeta(wellknown.Domain) + `/[A-Za-z0-9._-]*[A-Za-z0-9]`)

// TestChartUsesWellKnownNames holds every gpuguard.io name in the chart (its
// templates, values, files and README) to the names the binaries define: a
// label the chart selects on, documents or sets that the webhook or agent
// renamed, or never had, fails here instead of matching nothing in a cluster.
func TestChartUsesWellKnownNames(t *testing.T) {
	known := map[string]bool{
		wellknown.ModeLabel:                         true,
		wellknown.HardenedLabel:                     true,
		wellknown.CDIKind:                           true,
		wellknown.AgentReportingController:          true,
		wellknown.TolerateMissingEnforcerAnnotation: true,
		config.APIVersion:                           true,
	}
	found := 0
	err := filepath.WalkDir("gpuguard", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(data), "\n") {
			for _, name := range gpuguardName.FindAllString(line, -1) {
				found++
				if !known[name] && !strings.HasPrefix(name, wellknown.CheckLabelPrefix) {
					t.Errorf("%s:%d: %s is no name gpuguard's binaries define (internal/wellknown)", path, i+1, name)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found < 3 {
		t.Fatalf("found only %d gpuguard.io names in the chart: is the pattern right?", found)
	}
}
