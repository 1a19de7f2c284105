// Package release builds gpuguard's two container images without a container
// engine: each is a multi-platform OCI image index whose images hold a Go
// binary of this module, the files it needs to run and nothing else, with an
// SPDX SBOM attached to each platform's image as an OCI referrer. It then
// pushes them, and the Helm chart with both images pinned by digest, to a
// registry (docs/release.md).
//
// Builds are reproducible: the same source tree, Go toolchain and Debian
// packages give the same digests. Every timestamp is the source's (the
// SOURCE_DATE_EPOCH of reproducible-builds.org, else the last commit's), every
// file is owned by root with a fixed mode, and archives list files in order.
package release

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Spec is one image: a program of this module and how it runs.
type Spec struct {
	// Name is the image's repository name under a registry
	// (REGISTRY/Name:version).
	Name string
	// Package is the Go package of the program, relative to the repository.
	Package string
	// Binary is the program's path in the image; it is the entrypoint.
	Binary string
	// CGO builds with cgo, and then the image carries the C library the
	// binary links (from the build machine's Debian packages).
	CGO bool
	// User runs the entrypoint, "uid:gid". A non-root user also gets
	// /etc/passwd and /etc/group entries and a home directory, as
	// distroless's nonroot user has.
	User string
	// Description is the image's org.opencontainers.image.description.
	Description string
}

// Specs are the images the Helm chart runs.
func Specs() []Spec {
	return []Spec{
		{
			Name: "gpuguard", Package: "./cmd/gpuguard", Binary: "/usr/local/bin/gpuguard", User: "65532:65532",
			Description: "gpuguard admission webhook and CLI (static, non-root)",
		},
		{
			// Root and privileged by design: the agent serves the kubelet's
			// device plugin socket and reads every container's view of /dev
			// (docs/agent.md). NVML comes from the driver at run time.
			Name: "gpuguard-agent", Package: "./cmd/gpuguard-agent", Binary: "/usr/local/bin/gpuguard-agent", CGO: true, User: "0:0",
			Description: "gpuguard node agent: device plugin, GPU health, node hardening and runtime verification (glibc, for NVML)",
		},
	}
}

// Platform is an OS/architecture pair, as in linux/arm64.
type Platform struct{ OS, Arch string }

func (p Platform) String() string { return p.OS + "/" + p.Arch }

// DefaultPlatforms are the platforms a release builds.
var DefaultPlatforms = []Platform{{"linux", "amd64"}, {"linux", "arm64"}}

// HostPlatform is the platform of the machine running the build.
func HostPlatform() Platform { return Platform{"linux", runtime.GOARCH} }

// ParsePlatforms reads a comma-separated list such as
// "linux/amd64,linux/arm64".
func ParsePlatforms(s string) ([]Platform, error) {
	var out []Platform
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		osName, arch, ok := strings.Cut(item, "/")
		if !ok || osName != "linux" || crossTriple(arch) == "" {
			return nil, fmt.Errorf("platform %q: want linux/amd64 or linux/arm64", item)
		}
		p := Platform{osName, arch}
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no platform given")
	}
	return out, nil
}

// crossTriple is the GNU triple of a Debian architecture, which names its
// cross compiler, its library directory and its C library's location.
func crossTriple(arch string) string {
	switch arch {
	case "amd64":
		return "x86_64-linux-gnu"
	case "arm64":
		return "aarch64-linux-gnu"
	}
	return ""
}

// Source describes the tree the images are built from; it fills their
// labels and SBOMs and dates every file in them.
type Source struct {
	// RepoRoot is the module's root directory.
	RepoRoot string
	// Version tags the images: the chart's appVersion.
	Version string
	// Revision is the commit, when known.
	Revision string
	// Epoch dates every file, the image configurations and the SBOMs.
	Epoch time.Time
	// URL is the project's source repository.
	URL string
}
