package nodeconfig

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Status of one hardening check.
type Status string

// Check statuses.
const (
	Pass    Status = "pass"
	Warn    Status = "warn"
	Fail    Status = "fail"
	Unknown Status = "unknown"
)

// Statuses lists every status, for metrics.
var Statuses = []Status{Pass, Warn, Fail, Unknown}

// Check IDs, also the "check" label of the metric.
const (
	CheckToolkitConfig        = "toolkit_config_found"
	CheckEnvvarUnprivileged   = "envvar_when_unprivileged_rejected"
	CheckVolumeMounts         = "volume_mounts_accepted"
	CheckRuntimeMode          = "runtime_mode"
	CheckLdconfig             = "ldconfig_host_relative"
	CheckToolkitVersion       = "toolkit_version"
	CheckContainerdConfig     = "containerd_config_found"
	CheckNVIDIADefaultRuntime = "nvidia_not_default_runtime"
	CheckCDIPodAnnotations    = "cdi_pod_annotations_not_passed"
	CheckNRIPlugin            = "nvidia_nri_plugin_off"
)

// Check is one line of the hardening report.
type Check struct {
	ID     string `json:"id"`
	Status Status `json:"status"`
	Value  string `json:"value"`
	Detail string `json:"detail,omitempty"`
}

// Report is the node hardening report.
type Report struct {
	Toolkit        *ToolkitConfig    `json:"-"`
	Containerd     *ContainerdConfig `json:"-"`
	ToolkitVersion string            `json:"toolkitVersion,omitempty"`
	Checks         []Check           `json:"checks"`
}

// Hardened is true when no check failed.
func (r *Report) Hardened() bool {
	for _, c := range r.Checks {
		if c.Status == Fail {
			return false
		}
	}
	return true
}

// Get returns the check with the given ID.
func (r *Report) Get(id string) (Check, bool) {
	for _, c := range r.Checks {
		if c.ID == id {
			return c, true
		}
	}
	return Check{}, false
}

// Inputs is what the report is built from.
type Inputs struct {
	Toolkit        *ToolkitConfig // nil: not found
	ToolkitErr     error
	Containerd     *ContainerdConfig // nil: not found
	ContainerdErr  error
	ToolkitVersion string // "" when unknown
	// NRIPluginFiles are NVIDIA NRI plugin binaries or configs found on
	// the host; nil when not looked for.
	NRIPluginFiles []string
}

// Collect reads everything the report needs from the host.
func (l Locator) Collect(version string) Inputs {
	in := Inputs{ToolkitVersion: version}
	in.Toolkit, in.ToolkitErr = l.LoadToolkitConfig()
	in.Containerd, in.ContainerdErr = l.LoadContainerdConfig()
	if in.Containerd != nil {
		in.NRIPluginFiles = []string{}
		for _, dir := range []string{in.Containerd.NRIPluginPath, in.Containerd.NRIConfigPath} {
			entries, _ := os.ReadDir(l.host(dir))
			for _, e := range entries {
				if strings.Contains(strings.ToLower(e.Name()), "nvidia") {
					in.NRIPluginFiles = append(in.NRIPluginFiles, filepath.Join(dir, e.Name()))
				}
			}
		}
	}
	return in
}

// BuildReport evaluates every check.
func BuildReport(in Inputs) *Report {
	r := &Report{Toolkit: in.Toolkit, Containerd: in.Containerd, ToolkitVersion: in.ToolkitVersion}
	add := func(id string, s Status, value, detail string) {
		r.Checks = append(r.Checks, Check{ID: id, Status: s, Value: value, Detail: detail})
	}
	tk := in.Toolkit
	switch {
	case in.ToolkitErr != nil:
		add(CheckToolkitConfig, Fail, "error", in.ToolkitErr.Error())
	case tk == nil:
		add(CheckToolkitConfig, Fail, "not found", "no NVIDIA Container Toolkit config found ("+OperatorToolkitConfig+", "+DefaultToolkitConfig+"); pass --toolkit-config")
	default:
		add(CheckToolkitConfig, Pass, tk.Path, "")
	}
	if tk == nil {
		for _, id := range []string{CheckEnvvarUnprivileged, CheckVolumeMounts, CheckRuntimeMode, CheckLdconfig} {
			add(id, Unknown, "", "toolkit config not found")
		}
	} else {
		if tk.AcceptEnvvarUnprivileged {
			add(CheckEnvvarUnprivileged, Fail, "true", "any unprivileged container can request GPUs with NVIDIA_VISIBLE_DEVICES: set "+KeyAcceptEnvvarUnprivileged+" = false in "+tk.Path)
		} else {
			add(CheckEnvvarUnprivileged, Pass, "false", "")
		}
		switch {
		case tk.AcceptVolumeMounts:
			add(CheckVolumeMounts, Pass, "true", "")
		case tk.RuntimeMode == "cdi":
			add(CheckVolumeMounts, Pass, "false", "not needed: the runtime is in CDI mode")
		default:
			add(CheckVolumeMounts, Warn, "false", "the device plugin can only hand out GPUs through the forgeable env var: set "+KeyAcceptVolumeMounts+" = true in "+tk.Path+" (or run the runtime in CDI mode)")
		}
		if tk.RuntimeMode == "cdi" || !tk.AcceptEnvvarUnprivileged {
			add(CheckRuntimeMode, Pass, tk.RuntimeMode, "")
		} else {
			add(CheckRuntimeMode, Warn, tk.RuntimeMode, "in mode "+tk.RuntimeMode+" the runtime honours NVIDIA_VISIBLE_DEVICES from the environment")
		}
		if strings.HasPrefix(tk.Ldconfig, "@") {
			add(CheckLdconfig, Pass, tk.Ldconfig, "")
		} else {
			add(CheckLdconfig, Fail, tk.Ldconfig, "ldconfig runs from the container's file system: set "+KeyLdconfig+` = "@/sbin/ldconfig"`)
		}
	}
	if in.ToolkitVersion == "" {
		add(CheckToolkitVersion, Unknown, "", "nvidia-ctk not found or not runnable; pass --toolkit-version")
	} else if v, err := ParseVersion(in.ToolkitVersion); err != nil {
		add(CheckToolkitVersion, Unknown, in.ToolkitVersion, err.Error())
	} else if p := ToolkitVersionProblem(v); p != "" {
		add(CheckToolkitVersion, Fail, v.String(), p)
	} else {
		add(CheckToolkitVersion, Pass, v.String(), "")
	}

	c := in.Containerd
	switch {
	case in.ContainerdErr != nil:
		add(CheckContainerdConfig, Unknown, "error", in.ContainerdErr.Error())
	case c == nil:
		add(CheckContainerdConfig, Unknown, "not found", "no containerd config found; pass --containerd-config")
	default:
		add(CheckContainerdConfig, Pass, strings.Join(c.Paths, ","), "")
	}
	if c == nil {
		for _, id := range []string{CheckNVIDIADefaultRuntime, CheckCDIPodAnnotations, CheckNRIPlugin} {
			add(id, Unknown, "", "containerd config not found")
		}
		return r
	}
	switch {
	case !c.NVIDIAIsDefault():
		add(CheckNVIDIADefaultRuntime, Pass, c.DefaultRuntime, "")
	case tk == nil || tk.AcceptEnvvarUnprivileged:
		add(CheckNVIDIADefaultRuntime, Fail, c.DefaultRuntime, "every pod runs under the NVIDIA runtime and may name GPUs in its environment: make runc the default and use a RuntimeClass, or reject the env var in the toolkit")
	default:
		add(CheckNVIDIADefaultRuntime, Warn, c.DefaultRuntime, "every pod runs under the NVIDIA runtime; the toolkit rejects env var requests, but a RuntimeClass is safer")
	}
	if rts := c.CDIAnnotationPassthrough(); len(rts) > 0 {
		add(CheckCDIPodAnnotations, Fail, strings.Join(rts, ","), "pod annotations cdi.k8s.io/* reach the runtime, so pods can request CDI devices themselves: remove them from pod_annotations of runtime(s) "+strings.Join(rts, ", "))
	} else {
		add(CheckCDIPodAnnotations, Pass, "none", "")
	}
	switch {
	case c.NRIEnabled != nil && !*c.NRIEnabled:
		add(CheckNRIPlugin, Pass, "NRI disabled", "")
	case len(in.NRIPluginFiles) > 0:
		add(CheckNRIPlugin, Fail, strings.Join(in.NRIPluginFiles, ","), "the NVIDIA NRI plugin injects devices named in nvidia.cdi.k8s.io/* pod annotations: turn it off or make sure the admission webhook strips those annotations")
	case c.NRIEnabled == nil:
		add(CheckNRIPlugin, Unknown, "", "cannot tell whether NRI is enabled")
	default:
		add(CheckNRIPlugin, Unknown, "NRI enabled", "NRI is enabled; no NVIDIA NRI plugin file found, but an externally started plugin cannot be seen from files")
	}
	return r
}

// String renders the report for logs.
func (r *Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "hardened=%v", r.Hardened())
	for _, c := range r.Checks {
		fmt.Fprintf(&b, " %s=%s", c.ID, c.Status)
	}
	return b.String()
}
