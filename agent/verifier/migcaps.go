package verifier

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpuguard/gpuguard/agent/discovery"
)

// AddMIGCaps maps the MIG capability device nodes (/dev/nvidia-caps/...) to
// the MIG devices they open. A container on a MIG device gets its parent
// GPU's node and the capability nodes of its GPU instance and compute
// instance: the capability, not the parent's node, is what names the MIG
// device. The driver publishes each capability's minor number under
// /proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<GI>[/ci<CI>]/access, and
// the capability major in /proc/devices as nvidia-caps. A node without MIG
// (or without the driver) has none, and nothing is added.
func (t *DeviceTable) AddMIGCaps(procRoot string, inv *discovery.Inventory) error {
	major, err := capsMajor(filepath.Join(procRoot, "devices"))
	if err != nil || major < 0 {
		return err
	}
	for _, g := range inv.GPUs {
		for _, m := range g.MIG {
			gi := filepath.Join(procRoot, "driver", "nvidia", "capabilities", fmt.Sprintf("gpu%d", g.Minor), "mig", fmt.Sprintf("gi%d", m.GPUInstanceID))
			ci := filepath.Join(gi, fmt.Sprintf("ci%d", m.ComputeInstanceID))
			// The compute instance's capability names the MIG device. The GPU
			// instance's is shared by its compute instances: it counts as the
			// parent GPU, which any MIG allocation on that GPU allows.
			for access, uuid := range map[string]string{filepath.Join(ci, "access"): m.UUID, filepath.Join(gi, "access"): g.UUID} {
				minor, err := capMinor(access)
				if errors.Is(err, os.ErrNotExist) {
					continue
				}
				if err != nil {
					return err
				}
				t.byDev[unix.Mkdev(uint32(major), uint32(minor))] = uuid
			}
		}
	}
	return nil
}

// capsMajor reads the nvidia-caps character major from /proc/devices; -1
// when the driver registered none.
func capsMajor(path string) (int, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return -1, nil
	}
	if err != nil {
		return -1, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 2 && fields[1] == "nvidia-caps" {
			return strconv.Atoi(fields[0])
		}
		if strings.HasPrefix(sc.Text(), "Block devices") {
			break
		}
	}
	return -1, sc.Err()
}

// capMinor reads "DeviceFileMinor: N" from a capability's access file.
func capMinor(path string) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "DeviceFileMinor:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, fmt.Errorf("%s names no DeviceFileMinor", path)
}
