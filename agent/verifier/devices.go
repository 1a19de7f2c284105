package verifier

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/gpuguard/gpuguard/agent/discovery"
)

// NVIDIAMajor is the character-device major number of the NVIDIA driver's
// GPU nodes: /dev/nvidia<minor> is 195:<minor>, whatever its name.
const NVIDIAMajor = 195

// devWalkEntries bounds the walk of one container's /dev, at any depth: a
// container must not make a pass slow by filling its /dev. One that holds
// more is not verifiable, and is reported so, never passed over silently.
const devWalkEntries = 10000

// ErrTooManyDevEntries is a container /dev too large to walk.
var ErrTooManyDevEntries = errors.New("more than 10000 entries under /dev")

// DeviceTable maps device numbers to the GPUs they open. It is built from the
// inventory NVML reports, so a device node is matched by its numbers, not its
// name: a node renamed or created elsewhere in /dev is still seen.
type DeviceTable struct {
	byDev map[uint64]string // unix.Mkdev(major, minor) -> GPU UUID
}

// NewDeviceTable maps each GPU's /dev/nvidia<minor> numbers to its UUID.
func NewDeviceTable(inv *discovery.Inventory) *DeviceTable {
	t := &DeviceTable{byDev: map[uint64]string{}}
	for _, g := range inv.GPUs {
		t.byDev[unix.Mkdev(NVIDIAMajor, uint32(g.Minor))] = g.UUID
	}
	return t
}

// Reached is a GPU a container can open, and the device node it opens it by.
type Reached struct {
	UUID string
	Path string // inside the container, e.g. /dev/nvidia3; "pid N" for an NVML process
	// SeenBy says how: "device-node", "nvml-process" or both, comma-separated.
	SeenBy string `json:",omitempty"`
}

// ReachableGPUs lists the GPUs whose device nodes exist in the /dev of a
// container's root (root is /proc/<pid>/root), sorted by UUID, each once.
func (t *DeviceTable) ReachableGPUs(root string) ([]Reached, error) {
	devDir := filepath.Join(root, "dev")
	seen := map[string]Reached{}
	entries := 0
	err := filepath.WalkDir(devDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if path == devDir {
				return err
			}
			return nil // a node that vanished, or a directory it may not read
		}
		if entries++; entries > devWalkEntries {
			return ErrTooManyDevEntries
		}
		if d.IsDir() {
			return nil
		}
		if d.Type()&fs.ModeCharDevice == 0 {
			return nil
		}
		if uuid, ok := t.lookup(path); ok {
			if _, dup := seen[uuid]; !dup {
				rel, _ := filepath.Rel(root, path)
				seen[uuid] = Reached{UUID: uuid, Path: "/" + rel}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	out := make([]Reached, 0, len(seen))
	for _, r := range seen {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].UUID < out[j].UUID })
	return out, nil
}

func (t *DeviceTable) lookup(path string) (string, bool) {
	info, err := os.Lstat(path)
	if err != nil {
		return "", false
	}
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return "", false
	}
	uuid, ok := t.byDev[uint64(st.Rdev)]
	return uuid, ok
}
