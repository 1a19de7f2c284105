// Package upstreamchart fetches other projects' Helm charts at pinned versions,
// for the tests that hold gpuguard's presets against the manifests those
// projects ship. A Go module's zip carries its whole repository, charts
// included, so the Go module proxy serves them: no chart repository, no
// vendored copy.
package upstreamchart

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"helm.sh/helm/v3/pkg/chart"

	"github.com/gpuguard/gpuguard/tools/chartrender"
)

// Source is one upstream chart at a pinned module version.
type Source struct {
	// Module and Version name the Go module whose zip carries the chart.
	Module, Version string
	// Sum is the zip's go.sum hash ("h1:…"). It is checked here, because
	// some projects' tags are not in the public checksum database, so the
	// go command is told not to ask it for this module.
	Sum string
	// Dir is the chart's directory inside the module.
	Dir string
}

func (s Source) String() string { return s.Module + "@" + s.Version + "/" + s.Dir }

// downloaded is what `go mod download -json` says about one module.
type downloaded struct {
	Dir, Sum, Error string
}

// Fetch downloads the module, checks its hash and loads the chart at s.Dir.
func Fetch(ctx context.Context, s Source) (*chart.Chart, error) {
	dir, err := Download(ctx, s)
	if err != nil {
		return nil, err
	}
	return chartrender.Load(filepath.Join(dir, filepath.FromSlash(s.Dir)))
}

// Download downloads the module into the module cache (once; later calls
// read the cache), checks its hash against the pin and returns the
// directory of its files, read-only.
func Download(ctx context.Context, s Source) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", s.Module+"@"+s.Version)
	cmd.Env = append(os.Environ(), "GONOSUMDB="+s.Module)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	var d downloaded
	if err := json.Unmarshal(stdout.Bytes(), &d); err != nil {
		return "", fmt.Errorf("go mod download %s: %v: %s", s, runErr, strings.TrimSpace(stderr.String()))
	}
	switch {
	case d.Error != "":
		return "", fmt.Errorf("go mod download %s: %s", s, d.Error)
	case runErr != nil:
		return "", fmt.Errorf("go mod download %s: %v: %s", s, runErr, strings.TrimSpace(stderr.String()))
	case d.Sum != s.Sum:
		return "", fmt.Errorf("%s: the module's hash is %s, but %s is pinned: the tag moved or the download was altered", s, d.Sum, s.Sum)
	}
	return d.Dir, nil
}
