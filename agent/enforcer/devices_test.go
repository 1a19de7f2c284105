package enforcer

import (
	"maps"
	"strings"
	"testing"
)

// procDevices is a GPU node's /proc/devices: the dynamic majors of the
// NVIDIA drivers, and a block major that shares a number with one of them.
const procDevices = `Character devices:
  1 mem
  5 /dev/tty
 10 misc
195 nvidia
234 nvidia-uvm
235 nvidia-caps-imex-channels
236 nvidia-caps
237 nvidia-nvswitch

Block devices:
  8 sd
234 nvidia-looking-block
`

func TestParseDeviceMajors(t *testing.T) {
	m, err := ParseDeviceMajors(strings.NewReader(procDevices))
	if err != nil {
		t.Fatal(err)
	}
	want := DeviceMajors{195: "nvidia-frontend", 234: "nvidia-uvm", 235: "nvidia-caps-imex-channels", 236: "nvidia-caps", 237: "nvidia-nvswitch"}
	if !maps.Equal(m, want) {
		t.Errorf("majors %v, want %v", m, want)
	}
	if _, err := ReadDeviceMajors("/nonexistent/devices"); err == nil {
		t.Error("a missing /proc/devices read without an error")
	}
}

func i64(n int64) *int64 { return &n }

// TestDevicesByNumber: device nodes and device cgroup allow rules are
// judged by major and minor, whatever the node's path, against the
// allocation; what lies beyond it gets the container refused, since NRI
// can remove neither.
func TestDevicesByNumber(t *testing.T) {
	majors, err := ParseDeviceMajors(strings.NewReader(procDevices))
	if err != nil {
		t.Fatal(err)
	}
	read := testRules(t).WithDeviceMajors(majors)
	defaults := testRules(t)
	gpuA := Facts{Allocated: []string{"GPU-a"}}
	mig := Facts{Allocated: []string{"MIG-c0"}}
	allow := func(typ string, major, minor *int64, access string) DeviceRule {
		return DeviceRule{Allow: true, Type: typ, Major: major, Minor: minor, Access: access}
	}
	for _, tc := range []struct {
		name string
		r    *Rules
		c    Container
		f    Facts
		// refusing: what the refusal names; "" for created unchanged.
		refusing string
	}{
		{name: "a GPU's node under another path, no GPU", r: read, c: Container{Devices: []Device{{"/dev/gpu-b", "c", 195, 1}}}, refusing: "/dev/gpu-b (c 195:1) is a GPU"},
		{name: "a neighbour's GPU under another path", r: read, c: Container{Devices: []Device{{"/dev/gpu-b", "c", 195, 1}}}, f: gpuA, refusing: "/dev/gpu-b"},
		{name: "its own GPU under another path", r: read, c: Container{Devices: []Device{{"/dev/gpu-a", "c", 195, 0}}}, f: gpuA},
		{name: "nvidiactl without a GPU", r: read, c: Container{Devices: []Device{{"/dev/nvidiactl", "c", 195, 255}}}, refusing: "nvidiactl"},
		{name: "nvidiactl and uvm with a GPU", r: read, c: Container{Devices: []Device{{"/dev/nvidiactl", "c", 195, 255}, {"/dev/nvidia-uvm", "c", 234, 0}}}, f: gpuA},
		{name: "uvm under another path, no GPU", r: read, c: Container{Devices: []Device{{"/dev/u", "c", 234, 0}}}, refusing: "/dev/u (c 234:0)"},
		{name: "an IMEX channel without a GPU", r: read, c: Container{Devices: []Device{{"/dev/nvidia-caps-imex-channels/channel0", "c", 235, 0}}}, refusing: "channel0"},
		{name: "a MIG device's capability with it", r: read, c: Container{Devices: []Device{{"/dev/nvidia-caps/nvidia-cap21", "c", 236, 21}}}, f: mig},
		{name: "a MIG capability with a whole GPU", r: read, c: Container{Devices: []Device{{"/dev/nvidia-caps/nvidia-cap21", "c", 236, 21}}}, f: gpuA, refusing: "MIG capability"},
		{name: "the MIG config capability, even with a MIG device", r: read, c: Container{Devices: []Device{{"/dev/x", "c", 236, 1}}}, f: mig, refusing: "MIG config"},
		{name: "a node named like a GPU that is /dev/null", r: read, c: Container{Devices: []Device{{"/dev/nvidia1", "c", 1, 3}}}},
		{name: "a block device with a driver's number", r: read, c: Container{Devices: []Device{{"/dev/sdx", "b", 234, 0}}}},
		{name: "majors not read: uvm judged by its path", r: defaults, c: Container{Devices: []Device{{"/dev/nvidia-uvm", "c", 511, 0}}}, refusing: "/dev/nvidia-uvm"},
		{name: "majors not read: MIG monitor by its path", r: defaults, c: Container{Devices: []Device{{"/dev/nvidia-caps/nvidia-cap2", "c", 510, 2}}}, f: mig, refusing: "MIG config or monitor"},
		{name: "majors read: a path alone proves nothing", r: read, c: Container{Devices: []Device{{"/dev/nvidia-uvm", "c", 1, 3}}}},
		{name: "cgroup: every minor of the GPU major", r: read, c: Container{DeviceRules: []DeviceRule{allow("c", i64(195), nil, "rwm")}}, f: gpuA, refusing: "allows c 195:* rwm"},
		{name: "cgroup: a neighbour's minor", r: read, c: Container{DeviceRules: []DeviceRule{allow("c", i64(195), i64(1), "rw")}}, f: gpuA, refusing: "c 195:1 rw"},
		{name: "cgroup: its own minor and the shared nodes", r: read, f: gpuA,
			c: Container{DeviceRules: []DeviceRule{allow("c", i64(195), i64(0), "rw"), allow("c", i64(195), i64(255), "rw"), allow("c", i64(234), nil, "rw")}}},
		{name: "cgroup: uvm's every minor without a GPU", r: read, c: Container{DeviceRules: []DeviceRule{allow("c", i64(234), nil, "rw")}}, refusing: "major 234, nvidia-uvm"},
		{name: "cgroup: every character device", r: read, c: Container{DeviceRules: []DeviceRule{allow("c", nil, nil, "rwm")}}, f: gpuA, refusing: "allows c *:* rwm"},
		{name: "cgroup: mknod of anything, the runtime's default", r: read,
			c: Container{DeviceRules: []DeviceRule{{Access: "rwm"}, allow("c", nil, nil, "m"), allow("b", nil, nil, "m"), allow("c", i64(1), i64(3), "rwm")}}},
		{name: "cgroup: a deny rule", r: read, c: Container{DeviceRules: []DeviceRule{{Type: "c", Major: i64(195), Access: "rwm"}}}},
		{name: "cgroup: a block major", r: read, c: Container{DeviceRules: []DeviceRule{allow("b", i64(195), nil, "rw")}}},
		{name: "cgroup: an allocation not resolved leaves GPU minors alone", r: read,
			c: Container{DeviceRules: []DeviceRule{allow("c", i64(195), nil, "rw")}}, f: Facts{Allocated: []string{"GPU-a-_-0"}}},
		{name: "KAI fraction: the GPU of its reservation pod", r: read, c: Container{Devices: []Device{{"/dev/nvidia1", "c", 195, 1}}}, f: Facts{KAIFraction: true, KAIBound: []string{"GPU-b"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := tc.r.Decide(tc.c, tc.f)
			switch {
			case tc.refusing == "" && d.Changed():
				t.Errorf("changed: refuse %q, changes %v", d.Refuse, d.Changes)
			case tc.refusing != "" && !strings.Contains(d.Refuse, tc.refusing):
				t.Errorf("refuse = %q, want it naming %q", d.Refuse, tc.refusing)
			}
			if tc.refusing != "" && !tc.r.NeedsAllocation(tc.c) {
				t.Error("a container refused without its allocation must need it: an allocation may cover the device")
			}
		})
	}
}
