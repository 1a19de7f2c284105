package nodereport

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"time"
)

// Version is a toolkit release, e.g. 1.17.8.
type Version struct {
	Major, Minor, Patch int
	Pre                 string // "rc.1" for 1.18.0-rc.1
}

var versionRE = regexp.MustCompile(`(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.]+))?`)

// ParseVersion finds the first x.y.z[-pre] in s.
func ParseVersion(s string) (Version, error) {
	m := versionRE.FindStringSubmatch(s)
	if m == nil {
		return Version{}, fmt.Errorf("no version in %q", s)
	}
	var v Version
	v.Major, _ = strconv.Atoi(m[1])
	v.Minor, _ = strconv.Atoi(m[2])
	v.Patch, _ = strconv.Atoi(m[3])
	v.Pre = m[4]
	return v, nil
}

func (v Version) String() string {
	s := fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch)
	if v.Pre != "" {
		s += "-" + v.Pre
	}
	return s
}

// less compares releases; a pre-release sorts before its release.
func (v Version) less(o Version) bool {
	if v.Major != o.Major {
		return v.Major < o.Major
	}
	if v.Minor != o.Minor {
		return v.Minor < o.Minor
	}
	if v.Patch != o.Patch {
		return v.Patch < o.Patch
	}
	return v.Pre != "" && o.Pre == ""
}

// ToolkitVersionProblem says what is wrong with a toolkit release, or "".
// 1.17.8 fixes CVE-2025-23266; 1.18.0 and 1.18.1 expose every GPU to
// containers that ask for none.
func ToolkitVersionProblem(v Version) string {
	switch {
	case v.less(Version{Major: 1, Minor: 17, Patch: 8}):
		return "older than 1.17.8 (CVE-2025-23266): upgrade the NVIDIA Container Toolkit"
	case v.Major == 1 && v.Minor == 18 && v.Patch <= 1:
		return "1.18.0 and 1.18.1 expose all GPUs to containers that request none: upgrade to 1.18.2 or later"
	}
	return ""
}

// toolkitBinaries are where nvidia-ctk is found, relative to the host root.
var toolkitBinaries = []string{
	"/usr/local/nvidia/toolkit/nvidia-ctk",
	"/usr/bin/nvidia-ctk",
	"/usr/local/bin/nvidia-ctk",
}

// ProbeToolkitVersion runs the host's nvidia-ctk --version. It returns ""
// when no binary is found or it cannot run (the report then says unknown).
func (l Locator) ProbeToolkitVersion(ctx context.Context) string {
	for _, b := range toolkitBinaries {
		p := l.host(b)
		if st, err := os.Stat(p); err != nil || st.IsDir() {
			continue
		}
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		out, err := exec.CommandContext(ctx, filepath.Clean(p), "--version").Output()
		cancel()
		if err != nil {
			continue
		}
		if v, err := ParseVersion(string(out)); err == nil {
			return v.String()
		}
	}
	return ""
}
