package discovery

import (
	"fmt"
	"github.com/gpuguard/gpuguard/agent/discovery/nvmlmock"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Backend is an opened NVML (real or mock).
type Backend struct {
	Name string
	Lib  nvml.Interface
	// Mock is set for mock backends.
	Mock *nvmlmock.Node
}

// OpenBackend resolves --backend: "nvml" (libnvidia-ml.so.1, optionally at
// libraryPath), or "mock:NAME" / "mock:NAME:mig" (a go-nvml mock server with
// UUIDs stable for nodeName; ":mig" turns on MIG on GPUs 0 and 1).
func OpenBackend(spec, nodeName, libraryPath string) (*Backend, error) {
	switch {
	case spec == "" || spec == "nvml":
		var opts []nvml.LibraryOption
		if libraryPath != "" {
			opts = append(opts, nvml.WithLibraryPath(libraryPath))
		}
		return &Backend{Name: "nvml", Lib: nvml.New(opts...)}, nil
	case strings.HasPrefix(spec, "mock:"):
		rest := strings.TrimPrefix(spec, "mock:")
		name, variant, _ := strings.Cut(rest, ":")
		opts := nvmlmock.Options{NodeName: nodeName}
		switch variant {
		case "":
		case "mig":
			opts.MIG = nvmlmock.DefaultMIGLayout()
		default:
			return nil, fmt.Errorf("--backend=%s: unknown mock variant %q (only \"mig\")", spec, variant)
		}
		n, err := nvmlmock.NewNode(name, opts)
		if err != nil {
			return nil, fmt.Errorf("--backend=%s: %w", spec, err)
		}
		return &Backend{Name: spec, Lib: n.Server, Mock: n}, nil
	default:
		return nil, fmt.Errorf("--backend=%s: want nvml or mock:NAME (NAME one of %s)", spec, strings.Join(nvmlmock.Systems(), ", "))
	}
}
