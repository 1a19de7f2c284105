package framework

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// PinnedVersion reads KEY=VALUE from the repository's hack/versions.env,
// the single place versions are pinned.
func PinnedVersion(repoRoot, key string) (string, error) {
	path := filepath.Join(repoRoot, "hack", "versions.env")
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), key+"="); ok {
			return v, nil
		}
	}
	return "", fmt.Errorf("%s not in %s", key, path)
}

// ToolkitVersion is the pinned NVIDIA Container Toolkit version without its
// "v", as the agent's --toolkit-version takes it.
func ToolkitVersion(repoRoot string) (string, error) {
	v, err := PinnedVersion(repoRoot, "NVIDIA_CONTAINER_TOOLKIT_VERSION")
	return strings.TrimPrefix(v, "v"), err
}
