// Package cdispec makes sure the CDI devices the agent names in its
// allocations exist: it checks the toolkit's spec (nvidia-ctk cdi generate,
// the GPU Operator) or writes a spec of its own.
package cdispec

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpuguard/gpuguard/agent/discovery"
	"github.com/gpuguard/gpuguard/internal/wellknown"
)

// Modes of --cdi-spec.
const (
	// ModeAuto uses the toolkit's spec when it names every device, else
	// writes the agent's own.
	ModeAuto = "auto"
	// ModeToolkit requires the toolkit's spec.
	ModeToolkit = "toolkit"
	// ModeOwn always writes the agent's own spec.
	ModeOwn = "own"

	// VoidEnv neutralises NVIDIA_VISIBLE_DEVICES for the NVIDIA runtime.
	VoidEnv = "NVIDIA_VISIBLE_DEVICES=void"
)

// Config says where specs are.
type Config struct {
	Mode string
	// ToolkitKind is the kind of the toolkit's spec, e.g. "nvidia.com/gpu".
	ToolkitKind string
	// SpecDirs are searched for the toolkit's spec (already host-rooted).
	SpecDirs []string
	// WriteDir is where the own spec is written (already host-rooted).
	WriteDir string
	// DevRoot prefixes device node paths in the own spec (host paths).
	DevRoot string
}

// Result says which spec names the devices.
type Result struct {
	Kind   string // CDI kind to use in allocations
	Source string // "toolkit" or "own"
	Path   string // the own spec's file, when written
	// Missing lists toolkit names that were absent (when auto fell back).
	Missing []string
}

// Ensure makes sure every device of inv is named, by its index and by its
// UUID, in a spec; ids are the names the allocations will use.
func Ensure(cfg Config, inv *discovery.Inventory, ids []string) (Result, error) {
	switch cfg.Mode {
	case "", ModeAuto, ModeToolkit, ModeOwn:
	default:
		return Result{}, fmt.Errorf("--cdi-spec=%s: want auto, toolkit or own", cfg.Mode)
	}
	if cfg.Mode != ModeOwn {
		kind := cfg.ToolkitKind
		if kind == "" {
			kind = "nvidia.com/gpu"
		}
		missing, err := missingNames(cfg.SpecDirs, kind, ids)
		if err == nil && len(missing) == 0 {
			return Result{Kind: kind, Source: "toolkit"}, nil
		}
		if cfg.Mode == ModeToolkit {
			if err != nil {
				return Result{}, fmt.Errorf("reading CDI specs in %s: %w", strings.Join(cfg.SpecDirs, ", "), err)
			}
			return Result{}, fmt.Errorf("the CDI specs in %s do not name %s: generate them with 'nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml --device-name-strategy=index --device-name-strategy=uuid', or use --cdi-spec=own", strings.Join(cfg.SpecDirs, ", "), strings.Join(qualify(kind, missing), ", "))
		}
		r, werr := writeOwn(cfg, inv)
		r.Missing = missing
		return r, werr
	}
	return writeOwn(cfg, inv)
}

func qualify(kind string, ids []string) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = kind + "=" + id
	}
	return out
}

// missingNames lists the ids not defined as kind=id in the spec dirs.
func missingNames(dirs []string, kind string, ids []string) ([]string, error) {
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false))
	if err != nil {
		return nil, err
	}
	refreshErr := cache.Refresh()
	var missing []string
	for _, id := range ids {
		if cache.GetDevice(kind+"="+id) == nil {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 && refreshErr != nil {
		return missing, refreshErr
	}
	return missing, nil
}

// OwnSpec is the spec the agent writes: one device per GPU and MIG device,
// named by index and by UUID, with the device nodes; the common edits set
// NVIDIA_VISIBLE_DEVICES=void so the NVIDIA runtime adds nothing more. It
// holds no driver libraries: for those use the toolkit's spec.
func OwnSpec(inv *discovery.Inventory, devRoot string) *specs.Spec {
	node := func(p string) *specs.DeviceNode {
		n := &specs.DeviceNode{Path: p}
		if devRoot != "" && devRoot != "/" {
			n.HostPath = filepath.Join(devRoot, p)
		}
		return n
	}
	s := &specs.Spec{
		Kind: wellknown.CDIKind,
		ContainerEdits: specs.ContainerEdits{
			Env:         []string{VoidEnv},
			DeviceNodes: []*specs.DeviceNode{node("/dev/nvidiactl"), node("/dev/nvidia-uvm"), node("/dev/nvidia-uvm-tools")},
		},
	}
	add := func(edits specs.ContainerEdits, names ...string) {
		for _, n := range names {
			s.Devices = append(s.Devices, specs.Device{Name: n, ContainerEdits: edits})
		}
	}
	for _, g := range inv.GPUs {
		edits := specs.ContainerEdits{DeviceNodes: []*specs.DeviceNode{node("/dev/nvidia" + strconv.Itoa(g.Minor))}}
		if !g.MIGEnabled {
			add(edits, strconv.Itoa(g.Index), g.UUID)
			continue
		}
		for _, m := range g.MIG {
			add(edits, m.IndexID(), m.UUID)
		}
	}
	s.Version, _ = specs.MinimumRequiredVersion(s)
	return s
}

func writeOwn(cfg Config, inv *discovery.Inventory) (Result, error) {
	if cfg.WriteDir == "" {
		return Result{}, fmt.Errorf("no --cdi-spec-dir to write the agent's CDI spec to")
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(cfg.WriteDir), cdi.WithAutoRefresh(false))
	if err != nil {
		return Result{}, err
	}
	vendor, class, _ := strings.Cut(wellknown.CDIKind, "/")
	name := cdi.GenerateSpecName(vendor, class) + ".yaml"
	if err := cache.WriteSpec(OwnSpec(inv, cfg.DevRoot), name); err != nil {
		return Result{}, fmt.Errorf("writing CDI spec into %s: %w", cfg.WriteDir, err)
	}
	return Result{Kind: wellknown.CDIKind, Source: "own", Path: filepath.Join(cfg.WriteDir, name)}, nil
}

// Names returns the CDI device names a spec defines for kind (for tests
// and reports).
func Names(dirs []string, kind string) ([]string, error) {
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false))
	if err != nil {
		return nil, err
	}
	err = cache.Refresh()
	var out []string
	for _, d := range cache.ListDevices() {
		if strings.HasPrefix(d, kind+"=") {
			out = append(out, d)
		}
	}
	slices.Sort(out)
	return out, err
}
