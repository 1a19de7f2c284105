package release

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gpuguard/gpuguard/tools/chartrender"
)

// ReadSource describes the tree at repoRoot: the chart's appVersion and
// home, the checked-out commit, and the epoch, from SOURCE_DATE_EPOCH when
// set, else the commit's time. Outside a git checkout (a source archive)
// there is no revision and, without SOURCE_DATE_EPOCH, the epoch is 1970.
func ReadSource(repoRoot string) (Source, error) {
	c, err := chartrender.Load(filepath.Join(repoRoot, "charts", "gpuguard"))
	if err != nil {
		return Source{}, err
	}
	src := Source{RepoRoot: repoRoot, Version: c.Metadata.AppVersion, URL: c.Metadata.Home}
	if src.Version == "" {
		return Source{}, fmt.Errorf("charts/gpuguard/Chart.yaml has no appVersion to tag the images with")
	}
	src.Revision = git(repoRoot, "rev-parse", "HEAD")
	epoch := os.Getenv("SOURCE_DATE_EPOCH")
	if epoch == "" {
		epoch = git(repoRoot, "log", "-1", "--format=%ct")
	}
	if epoch != "" {
		secs, err := strconv.ParseInt(epoch, 10, 64)
		if err != nil {
			return Source{}, fmt.Errorf("SOURCE_DATE_EPOCH %q: want seconds since 1970", epoch)
		}
		src.Epoch = time.Unix(secs, 0).UTC()
	} else {
		src.Epoch = time.Unix(0, 0).UTC()
	}
	return src, nil
}

// git answers a git query in dir, or "" where there is no repository.
func git(dir string, args ...string) string {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}
