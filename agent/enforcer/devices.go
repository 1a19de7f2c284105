package enforcer

import (
	"bufio"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
)

// The kernel and the device cgroup know a device by its type and numbers,
// not by its path: a node created under any name with a GPU's numbers opens
// that GPU where the cgroup allows it, and a root container keeps CAP_MKNOD.
// So the enforcer judges a container's character device nodes and its
// device cgroup's allow rules by major and minor.

// GPUMajor is the character major of the NVIDIA driver's GPU nodes
// (/dev/nvidiaN), nvidiactl (minor 255) and nvidia-modeset (254).
const GPUMajor = 195

const (
	ctlMinor     = 255
	modesetMinor = 254
	// The MIG capability minors of the whole driver: config (create and
	// destroy GPU and compute instances) and monitor (observe every MIG
	// device); /proc/driver/nvidia-caps/mig-minors lists them first.
	capConfigMinor  = 1
	capMonitorMinor = 2
)

// Driver names in /proc/devices.
const (
	driverGPU  = "nvidia-frontend"
	driverCaps = "nvidia-caps"
)

// DeviceMajors are the character majors of NVIDIA's drivers on the node,
// by the names /proc/devices gives them: nvidia-frontend (195),
// nvidia-uvm, nvidia-caps, nvidia-caps-imex-channels, nvidia-nvlink,
// nvidia-nvswitch and others whose names begin with nvidia. All but 195 are
// given out as the drivers load.
type DeviceMajors map[int64]string

// DefaultDeviceMajors are the majors known without the node's
// /proc/devices: the GPU nodes'.
func DefaultDeviceMajors() DeviceMajors { return DeviceMajors{GPUMajor: driverGPU} }

// ParseDeviceMajors reads the character devices of a /proc/devices file,
// keeping NVIDIA's (names beginning with nvidia), with the GPU nodes' major
// always among them.
func ParseDeviceMajors(r io.Reader) (DeviceMajors, error) {
	m := DefaultDeviceMajors()
	sc := bufio.NewScanner(r)
	char := false
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "Character devices:":
			char = true
			continue
		case strings.HasSuffix(line, ":"):
			char = false
			continue
		case !char:
			continue
		}
		num, name, ok := strings.Cut(line, " ")
		name = strings.TrimSpace(name)
		major, err := strconv.ParseInt(num, 10, 64)
		if !ok || err != nil || !strings.HasPrefix(name, "nvidia") {
			continue
		}
		if major == GPUMajor {
			name = driverGPU // "nvidia" in older drivers
		}
		m[major] = name
	}
	return m, sc.Err()
}

// ReadDeviceMajors reads the node's /proc/devices at path, once, when the
// enforcer starts; on an error it returns the default majors with it.
func ReadDeviceMajors(path string) (DeviceMajors, error) {
	f, err := os.Open(path)
	if err != nil {
		return DefaultDeviceMajors(), err
	}
	defer f.Close()
	m, err := ParseDeviceMajors(f)
	if err != nil {
		return DefaultDeviceMajors(), fmt.Errorf("reading %s: %w", path, err)
	}
	return m, nil
}

// has reports whether driver's major is known.
func (m DeviceMajors) has(driver string) bool {
	for _, d := range m {
		if d == driver {
			return true
		}
	}
	return false
}

// Device is one device node of a container's spec.
type Device struct {
	Path         string
	Type         string
	Major, Minor int64
}

// DeviceRule is one rule of a container's device cgroup
// (linux.resources.devices); a nil major or minor is a wildcard.
type DeviceRule struct {
	Allow        bool
	Type         string
	Major, Minor *int64
	Access       string
}

func (r DeviceRule) String() string {
	num := func(n *int64) string {
		if n == nil {
			return "*"
		}
		return strconv.FormatInt(*n, 10)
	}
	typ := r.Type
	if typ == "" {
		typ = "a"
	}
	return fmt.Sprintf("%s %s:%s %s", typ, num(r.Major), num(r.Minor), r.Access)
}

// kind is what a character device is to gpuguard.
type kind int

const (
	kindOther kind = iota
	// kindGPU: a GPU node, /dev/nvidiaN with N its minor.
	kindGPU
	// kindShared: what every GPU container needs and no other may have:
	// nvidiactl, nvidia-modeset, nvidia-uvm, IMEX channels, NVLink and
	// NVSwitch nodes, and any other NVIDIA driver's.
	kindShared
	// kindMIGCap: a MIG device's capability node (nvidia-caps).
	kindMIGCap
	// kindMIGManage: the MIG config and monitor capabilities.
	kindMIGManage
)

// kindOf says what the character device major:minor is; minor nil stands
// for every minor, and the most powerful kind among them is returned.
func (m DeviceMajors) kindOf(major int64, minor *int64) kind {
	driver, ok := m[major]
	switch {
	case !ok:
		return kindOther
	case driver == driverGPU:
		if minor == nil {
			return kindGPU
		}
		if *minor == ctlMinor || *minor == modesetMinor {
			return kindShared
		}
		return kindGPU
	case driver == driverCaps:
		if minor == nil || *minor == capConfigMinor || *minor == capMonitorMinor {
			return kindMIGManage
		}
		return kindMIGCap
	default:
		return kindShared
	}
}

// pathDrivers name, for the drivers whose majors are given out as they
// load, the paths their nodes have: where the node's /proc/devices did not
// list the driver when the enforcer started, a node is judged by its path.
var pathDrivers = []struct{ prefix, driver string }{
	{"/dev/nvidia-caps-imex-channels/", "nvidia-caps-imex-channels"},
	{"/dev/nvidia-caps/", driverCaps},
	{"/dev/nvidia-uvm", "nvidia-uvm"},
	{"/dev/nvidia-nvswitch", "nvidia-nvswitch"},
	{"/dev/nvidia-nvlink", "nvidia-nvlink"},
}

// nodeKind says what a device node of the spec is: by its numbers, or by
// its path where its driver's major is not known.
func (m DeviceMajors) nodeKind(d Device) (kind, int64) {
	if d.Type != "c" && d.Type != "u" {
		return kindOther, 0
	}
	if k := m.kindOf(d.Major, &d.Minor); k != kindOther {
		return k, d.Minor
	}
	for _, p := range pathDrivers {
		if !strings.HasPrefix(d.Path, p.prefix) || m.has(p.driver) {
			continue
		}
		if p.driver != driverCaps {
			return kindShared, d.Minor
		}
		n, err := strconv.ParseInt(strings.TrimPrefix(d.Path, p.prefix+"nvidia-cap"), 10, 64)
		if err != nil || n == capConfigMinor || n == capMonitorMinor {
			return kindMIGManage, n
		}
		return kindMIGCap, n
	}
	return kindOther, 0
}

// deviceLimits are what the allocation lets a container reach.
type deviceLimits struct {
	g grant
	// gpu: the container has GPUs (an allocation, a claim, or a KAI
	// fraction).
	gpu bool
	// keep: its GPU devices are not judged (the exemption waives the GPU
	// rule).
	keep bool
}

// allows reports whether a device of kind k (a GPU node's minor where
// minor is set) is within the limits.
func (l deviceLimits) allows(k kind, minor *int64) bool {
	switch k {
	case kindOther:
		return true
	case kindShared:
		return l.gpu || l.keep
	case kindMIGCap:
		return l.keep || l.g.mig || l.g.unknown
	case kindMIGManage:
		return l.keep
	}
	// A GPU node: its minor allocated. Where the allocation names devices
	// gpuguard cannot resolve, it cannot tell which nodes they need.
	if l.keep || l.g.unknown {
		return true
	}
	return minor != nil && l.g.minors[int(*minor)]
}

var kindNames = map[kind]string{kindGPU: "a GPU", kindShared: "a GPU driver node every GPU container gets",
	kindMIGCap: "a MIG capability", kindMIGManage: "the MIG config or monitor capability"}

// decideDevices refuses a container with a device node or a device cgroup
// allow rule beyond its allocation. NRI v0.11 can neither remove a device
// node the runtime put in the spec (adjustDevices passes no removal on)
// nor a cgroup rule (a plugin can only append rules), so there is nothing
// to narrow: the container is refused, naming the device.
func (r *Rules) decideDevices(c Container, l deviceLimits) (refuse string) {
	if c.AllDevices {
		// Privileged, and its exemption waives that: the runtime gives it
		// every device of the host anyway.
		return ""
	}
	for _, d := range c.Devices {
		k, minor := r.majors.nodeKind(d)
		if !l.allows(k, &minor) {
			return fmt.Sprintf("gpuguard: device node %s (%s %d:%d) is %s, which the kubelet did not allocate to the container; NRI cannot remove a device node from the spec: remove it from the pod, or exempt its service account",
				d.Path, d.Type, d.Major, d.Minor, kindNames[k])
		}
	}
	for _, rule := range c.DeviceRules {
		if !rule.Allow || !strings.ContainsAny(rule.Access, "rw") || rule.Type == "b" {
			continue
		}
		majors := []int64{}
		if rule.Major != nil {
			majors = append(majors, *rule.Major)
		} else {
			majors = slices.Sorted(maps.Keys(r.majors))
		}
		for _, major := range majors {
			if k := r.majors.kindOf(major, rule.Minor); !l.allows(k, rule.Minor) {
				return fmt.Sprintf("gpuguard: the container's device cgroup allows %s, which reaches %s the kubelet did not allocate to it (major %d, %s); NRI cannot remove a device cgroup rule: remove it from the pod, or exempt its service account",
					rule, kindNames[k], major, r.majors[major])
			}
		}
	}
	return ""
}
