package nodereport

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
	CheckNRIValidator         = "nri_validator_enabled"
	CheckEnforcerRequired     = "gpuguard_nri_required"
)

// EnforcerPlugin is the node enforcer's NRI plugin name, as containerd's
// required_plugins names it.
const EnforcerPlugin = "gpuguard"

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
	for _, hc := range hardeningChecks {
		c := Check{ID: hc.id, Status: Unknown}
		switch {
		case hc.needsToolkit && in.Toolkit == nil:
			c.Detail = "toolkit config not found"
		case hc.needsContainerd && in.Containerd == nil:
			c.Detail = "containerd config not found"
		default:
			c.Status, c.Value, c.Detail = hc.judge(in)
		}
		r.Checks = append(r.Checks, c)
	}
	return r
}

// hardeningCheck judges one setting of the node. A check that reads the
// toolkit's or containerd's configuration is Unknown without it.
type hardeningCheck struct {
	id                            string
	needsToolkit, needsContainerd bool
	judge                         func(in Inputs) (status Status, value, detail string)
}

// hardeningChecks are the report's checks, in its order.
var hardeningChecks = []hardeningCheck{
	{id: CheckToolkitConfig, judge: judgeToolkitConfig},
	{id: CheckEnvvarUnprivileged, needsToolkit: true, judge: judgeEnvvarUnprivileged},
	{id: CheckVolumeMounts, needsToolkit: true, judge: judgeVolumeMounts},
	{id: CheckRuntimeMode, needsToolkit: true, judge: judgeRuntimeMode},
	{id: CheckLdconfig, needsToolkit: true, judge: judgeLdconfig},
	{id: CheckToolkitVersion, judge: judgeToolkitVersion},
	{id: CheckContainerdConfig, judge: judgeContainerdConfig},
	{id: CheckNVIDIADefaultRuntime, needsContainerd: true, judge: judgeNVIDIADefaultRuntime},
	{id: CheckCDIPodAnnotations, needsContainerd: true, judge: judgeCDIPodAnnotations},
	{id: CheckNRIPlugin, needsContainerd: true, judge: judgeNRIPlugin},
	{id: CheckNRIValidator, needsContainerd: true, judge: judgeNRIValidator},
	{id: CheckEnforcerRequired, needsContainerd: true, judge: judgeEnforcerRequired},
}

func judgeToolkitConfig(in Inputs) (Status, string, string) {
	switch {
	case in.ToolkitErr != nil:
		return Fail, "error", in.ToolkitErr.Error()
	case in.Toolkit == nil:
		return Fail, "not found", "no NVIDIA Container Toolkit config found (" + OperatorToolkitConfig + ", " + DefaultToolkitConfig + "); pass --toolkit-config"
	}
	return Pass, in.Toolkit.Path, ""
}

func judgeEnvvarUnprivileged(in Inputs) (Status, string, string) {
	if in.Toolkit.AcceptEnvvarUnprivileged {
		return Fail, "true", "any unprivileged container can request GPUs with NVIDIA_VISIBLE_DEVICES: set " + KeyAcceptEnvvarUnprivileged + " = false in " + in.Toolkit.Path
	}
	return Pass, "false", ""
}

func judgeVolumeMounts(in Inputs) (Status, string, string) {
	tk := in.Toolkit
	switch {
	case tk.AcceptVolumeMounts:
		return Pass, "true", ""
	case tk.RuntimeMode == "cdi":
		return Pass, "false", "not needed: the runtime is in CDI mode"
	}
	return Warn, "false", "the device plugin can only hand out GPUs through the forgeable env var: set " + KeyAcceptVolumeMounts + " = true in " + tk.Path + " (or run the runtime in CDI mode)"
}

func judgeRuntimeMode(in Inputs) (Status, string, string) {
	tk := in.Toolkit
	if tk.RuntimeMode == "cdi" || !tk.AcceptEnvvarUnprivileged {
		return Pass, tk.RuntimeMode, ""
	}
	return Warn, tk.RuntimeMode, "in mode " + tk.RuntimeMode + " the runtime honours NVIDIA_VISIBLE_DEVICES from the environment"
}

func judgeLdconfig(in Inputs) (Status, string, string) {
	if strings.HasPrefix(in.Toolkit.Ldconfig, "@") {
		return Pass, in.Toolkit.Ldconfig, ""
	}
	return Fail, in.Toolkit.Ldconfig, "ldconfig runs from the container's file system: set " + KeyLdconfig + ` = "@/sbin/ldconfig"`
}

func judgeToolkitVersion(in Inputs) (Status, string, string) {
	if in.ToolkitVersion == "" {
		return Unknown, "", "nvidia-ctk not found or not runnable; pass --toolkit-version"
	}
	v, err := ParseVersion(in.ToolkitVersion)
	if err != nil {
		return Unknown, in.ToolkitVersion, err.Error()
	}
	if p := ToolkitVersionProblem(v); p != "" {
		return Fail, v.String(), p
	}
	return Pass, v.String(), ""
}

func judgeContainerdConfig(in Inputs) (Status, string, string) {
	switch {
	case in.ContainerdErr != nil:
		return Unknown, "error", in.ContainerdErr.Error()
	case in.Containerd == nil:
		return Unknown, "not found", "no containerd config found; pass --containerd-config"
	}
	return Pass, strings.Join(in.Containerd.Paths, ","), ""
}

func judgeNVIDIADefaultRuntime(in Inputs) (Status, string, string) {
	c, tk := in.Containerd, in.Toolkit
	switch {
	case !c.NVIDIAIsDefault():
		return Pass, c.DefaultRuntime, ""
	case tk == nil || tk.AcceptEnvvarUnprivileged:
		return Fail, c.DefaultRuntime, "every pod runs under the NVIDIA runtime and may name GPUs in its environment: make runc the default and use a RuntimeClass, or reject the env var in the toolkit"
	}
	return Warn, c.DefaultRuntime, "every pod runs under the NVIDIA runtime; the toolkit rejects env var requests, but a RuntimeClass is safer"
}

func judgeCDIPodAnnotations(in Inputs) (Status, string, string) {
	if rts := in.Containerd.CDIAnnotationPassthrough(); len(rts) > 0 {
		return Fail, strings.Join(rts, ","), "pod annotations cdi.k8s.io/* reach the runtime, so pods can request CDI devices themselves: remove them from pod_annotations of runtime(s) " + strings.Join(rts, ", ")
	}
	return Pass, "none", ""
}

func judgeNRIPlugin(in Inputs) (Status, string, string) {
	c := in.Containerd
	switch {
	case c.NRIEnabled != nil && !*c.NRIEnabled:
		return Pass, "NRI disabled", ""
	case len(in.NRIPluginFiles) > 0:
		return Fail, strings.Join(in.NRIPluginFiles, ","), "the NVIDIA NRI plugin injects devices named in nvidia.cdi.k8s.io/* pod annotations: turn it off or make sure the admission webhook strips those annotations"
	case c.NRIEnabled == nil:
		return Unknown, "", "cannot tell whether NRI is enabled"
	}
	return Unknown, "NRI enabled", "NRI is enabled; no NVIDIA NRI plugin file found, but an externally started plugin cannot be seen from files"
}

// nriValidatorSection is where containerd 2.2 and later read NRI's default
// validator.
const nriValidatorSection = `[plugins."io.containerd.nri.v1.nri".default_validator]`

// judgeNRIValidator: NRI's default validator runs. It is what holds every
// container to required plugins; the node enforcer's own validation of the
// final spec runs whenever it is connected, with or without it. Warn, not
// fail: a node without the enforcer needs neither.
func judgeNRIValidator(in Inputs) (Status, string, string) {
	c := in.Containerd
	switch {
	case c.NRIEnabled != nil && !*c.NRIEnabled:
		return Warn, "NRI disabled", "the node enforcer needs NRI: set disable = false under [plugins.\"io.containerd.nri.v1.nri\"]"
	case !c.NRIValidator.Enabled:
		return Warn, "false", "containers are created without the node enforcer while it is not connected: set enable = true under " + nriValidatorSection + " (containerd 2.2 and later)"
	}
	return Pass, "true", ""
}

// judgeEnforcerRequired: NRI's default validator requires the node
// enforcer, so that no container is created while it is away. A toleration
// annotation is reported: a pod that may set it is created without the
// enforcer.
func judgeEnforcerRequired(in Inputs) (Status, string, string) {
	v := in.Containerd.NRIValidator
	if !v.Requires(EnforcerPlugin) {
		return Warn, strings.Join(v.RequiredPlugins, ","), "containers are created without the node enforcer while it is not connected: set enable = true and required_plugins = [\"" + EnforcerPlugin + "\"] under " + nriValidatorSection
	}
	if v.TolerateAnnotation != "" {
		return Pass, strings.Join(v.RequiredPlugins, ","), "pods annotated " + v.TolerateAnnotation + "=true are created without it: deny that annotation key at admission (the policy's annotations.deniedKeys) but for the agent and static pods"
	}
	return Pass, strings.Join(v.RequiredPlugins, ","), ""
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
