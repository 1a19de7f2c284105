package enforcer

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	rspec "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpuguard/gpuguard/internal/wellknown"
)

// A variable set more than once in a container's environment (the image's,
// the device plugin's and the pod's values, which containerd keeps side by
// side) cannot be narrowed through NRI's environment adjustment: its spec
// generator changes the first occurrence and folds the later ones onto it,
// and the runtime reads the last. CDI edits can: the runtime applies them
// after NRI's, and they append a variable rather than replace it, so the
// value they set is the one the NVIDIA runtime reads. The enforcer then
// asks for its own void device, which sets every device variable to void,
// and for the allocated devices by the names the node's CDI specs give them.

// VoidKind and VoidDevice name the enforcer's own CDI device.
const (
	VoidKind   = wellknown.Domain + "/enforcer"
	VoidDevice = VoidKind + "=void"
)

// VoidSpec is the enforcer's CDI spec: one device, void, whose only edit
// sets each device variable to void.
func VoidSpec(deviceVariables []string) *specs.Spec {
	s := &specs.Spec{Kind: VoidKind}
	edits := specs.ContainerEdits{}
	for _, v := range deviceVariables {
		edits.Env = append(edits.Env, v+"="+Void)
	}
	s.Devices = []specs.Device{{Name: Void, ContainerEdits: edits}}
	s.Version, _ = specs.MinimumRequiredVersion(s)
	return s
}

// WriteVoidSpec writes VoidSpec into dir, a directory the runtime reads CDI
// specs from, and returns its path.
func WriteVoidSpec(dir string, deviceVariables []string) (string, error) {
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		return "", err
	}
	vendor, class, _ := strings.Cut(VoidKind, "/")
	name := cdi.GenerateSpecName(vendor, class) + ".yaml"
	if err := cache.WriteSpec(VoidSpec(deviceVariables), name); err != nil {
		return "", fmt.Errorf("writing the node enforcer's CDI spec into %s: %w", dir, err)
	}
	return filepath.Join(dir, name), nil
}

// CDINamer names, through the node's CDI specs, the devices that narrow a
// container whose environment cannot be.
type CDINamer interface {
	// Qualify returns the CDI devices to inject: the enforcer's void
	// device, then, for each device (its names, UUID first), kind=name for
	// the first name a spec of the node defines. An error says which is not
	// defined.
	Qualify(devices [][]string) ([]string, error)
}

// SpecDirs reads the CDI specs in a node's spec directories, as the runtime
// does, each time it is asked: the path that needs it is rare (a variable
// set twice), and a fresh read sees specs written since.
type SpecDirs struct {
	// HostRoot is where the host's file system is, to read the numbers of
	// device nodes a spec leaves them out of; "" is /.
	HostRoot string

	dirs  []string
	cache *cdi.Cache
	// kinds are tried in order: the toolkit's, then the agent's own.
	kinds []string
}

// NewSpecDirs reads the specs of kinds in dirs.
func NewSpecDirs(dirs, kinds []string) (*SpecDirs, error) {
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false))
	if err != nil {
		return nil, err
	}
	return &SpecDirs{dirs: dirs, cache: cache, kinds: kinds}, nil
}

// Qualify implements CDINamer.
func (s *SpecDirs) Qualify(devices [][]string) ([]string, error) {
	// A spec that fails to parse does not hide the others, as in the
	// runtime; a name it should have defined is then simply not found.
	_ = s.cache.Refresh()
	void := s.cache.GetDevice(VoidDevice)
	if void == nil {
		return nil, fmt.Errorf("the node enforcer's CDI device %s is not in %s", VoidDevice, strings.Join(s.dirs, ", "))
	}
	if err := onlyVoids(void); err != nil {
		return nil, fmt.Errorf("the node enforcer's CDI device %s (%s) %w; restart the agent to write it again", VoidDevice, void.GetSpec().GetPath(), err)
	}
	out := []string{VoidDevice}
	for _, names := range devices {
		q := s.qualified(names)
		if q == "" {
			return nil, fmt.Errorf("no CDI spec in %s names device %s as %s; generate the toolkit's with nvidia-ctk cdi generate",
				strings.Join(s.dirs, ", "), strings.Join(names, " or "), strings.Join(s.kinds, " or "))
		}
		out = append(out, q)
	}
	return out, nil
}

// onlyVoids checks that the void device, wherever it was read from, does
// what the enforcer wrote and nothing more: it sets variables to void, and
// adds no device node, mount or hook, in its own edits or its spec's. A
// spec replaced on the host would otherwise ride on every narrowed
// container.
func onlyVoids(d *cdi.Device) error {
	for _, edits := range []specs.ContainerEdits{d.ContainerEdits, d.GetSpec().ContainerEdits} {
		if len(edits.DeviceNodes)+len(edits.Mounts)+len(edits.Hooks)+len(edits.AdditionalGIDs) > 0 || edits.IntelRdt != nil {
			return errors.New("adds more than variables")
		}
		for _, e := range edits.Env {
			if _, v, _ := strings.Cut(e, "="); v != Void {
				return fmt.Errorf("sets %q", e)
			}
		}
	}
	return nil
}

func (s *SpecDirs) qualified(names []string) string {
	for _, kind := range s.kinds {
		for _, n := range names {
			if s.cache.GetDevice(kind+"="+n) != nil {
				return kind + "=" + n
			}
		}
	}
	return ""
}

// Inject implements CDIInjector: it applies each device's edits, and its
// spec's, as the runtime does (CDI's ContainerEdits.Apply), once each spec.
// A device node the spec gives no numbers is read from the host, under
// HostRoot, as the runtime reads it; where it cannot be, a GPU node's
// numbers are told from its path (/dev/nvidiaN, nvidiactl,
// nvidia-modeset), and any other node is an error, as it is to the runtime.
func (s *SpecDirs) Inject(spec *rspec.Spec, devices []string) error {
	_ = s.cache.Refresh()
	done := map[*cdi.Spec]bool{}
	for _, name := range devices {
		d := s.cache.GetDevice(name)
		if d == nil {
			return fmt.Errorf("no CDI spec in %s defines device %s", strings.Join(s.dirs, ", "), name)
		}
		all := []specs.ContainerEdits{d.ContainerEdits}
		if sp := d.GetSpec(); !done[sp] {
			done[sp] = true
			all = append([]specs.ContainerEdits{sp.ContainerEdits}, all...)
		}
		for _, edits := range all {
			edits.DeviceNodes = slices.Clone(edits.DeviceNodes)
			for i, n := range edits.DeviceNodes {
				filled, err := s.numbered(*n)
				if err != nil {
					return fmt.Errorf("CDI device %s: %w", name, err)
				}
				edits.DeviceNodes[i] = &filled
			}
			if err := (&cdi.ContainerEdits{ContainerEdits: &edits}).Apply(spec); err != nil {
				return fmt.Errorf("CDI device %s: %w", name, err)
			}
		}
	}
	return nil
}

// numbered fills a CDI device node's type and numbers where its spec
// leaves them out.
func (s *SpecDirs) numbered(n specs.DeviceNode) (specs.DeviceNode, error) {
	if n.Type != "" && (n.Major != 0 || n.Type == "p") {
		return n, nil
	}
	host := n.HostPath
	if host == "" {
		host = n.Path
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(s.HostRoot, host), &st); err == nil {
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFCHR:
			n.Type = "c"
		case unix.S_IFBLK:
			n.Type = "b"
		default:
			return n, fmt.Errorf("device node %s (host %s) is not a device", n.Path, host)
		}
		n.Major, n.Minor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
		return n, nil
	}
	base := strings.TrimPrefix(host, "/dev/")
	switch {
	case base == "nvidiactl":
		n.Type, n.Major, n.Minor = "c", GPUMajor, ctlMinor
	case base == "nvidia-modeset":
		n.Type, n.Major, n.Minor = "c", GPUMajor, modesetMinor
	case strings.HasPrefix(base, "nvidia"):
		minor, err := strconv.ParseInt(strings.TrimPrefix(base, "nvidia"), 10, 64)
		if err != nil {
			return n, fmt.Errorf("device node %s (host %s): its numbers cannot be read from the host", n.Path, host)
		}
		n.Type, n.Major, n.Minor = "c", GPUMajor, minor
	default:
		return n, fmt.Errorf("device node %s (host %s): its numbers cannot be read from the host", n.Path, host)
	}
	return n, nil
}
