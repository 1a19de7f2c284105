package release

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// buildBinary compiles spec's program for p into dir and returns its path.
// The flags are those of a reproducible build: -trimpath drops this
// machine's paths, and Go's build IDs are content hashes. Symbols and DWARF
// are stripped, as in any release image.
func buildBinary(ctx context.Context, src Source, spec Spec, p Platform, dir string) (string, error) {
	out := filepath.Join(dir, p.OS+"-"+p.Arch, filepath.Base(spec.Binary))
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, spec.Package)
	cmd.Dir = src.RepoRoot
	cmd.Env = append(os.Environ(), "GOOS="+p.OS, "GOARCH="+p.Arch, "CGO_ENABLED=0")
	if spec.CGO {
		cc, err := cCompiler(p)
		if err != nil {
			return "", fmt.Errorf("%s for %s: %w", spec.Name, p, err)
		}
		cmd.Env = append(cmd.Env, "CGO_ENABLED=1", "CC="+cc)
	}
	// Compiler output (cgo's deprecation warnings from NVML's header) is
	// shown only when the build fails.
	if log, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s for %s: %w\n%s", spec.Package, p, err, log)
	}
	return out, nil
}

// cCompiler is the C compiler that targets p: the machine's own for its
// own architecture, else Debian's cross compiler for p (CC_<arch> overrides).
func cCompiler(p Platform) (string, error) {
	if cc := os.Getenv("CC_" + p.Arch); cc != "" {
		return cc, nil
	}
	if p == HostPlatform() {
		if cc := os.Getenv("CC"); cc != "" {
			return cc, nil
		}
		return "gcc", nil
	}
	cc := crossTriple(p.Arch) + "-gcc"
	if _, err := exec.LookPath(cc); err != nil {
		return "", fmt.Errorf("cgo needs a C cross compiler, and %s is not on PATH: install Debian's cross compiler "+
			"and C library for %s (hack/packages.txt lists them; hack/install-deps.sh installs them), set CC_%s to another, "+
			"or build only this machine's platform with PLATFORMS=%s",
			cc, p, p.Arch, HostPlatform())
	}
	return cc, nil
}
