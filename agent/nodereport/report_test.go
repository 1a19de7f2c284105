package nodereport

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func collect(t *testing.T, scenario, version string) *Report {
	t.Helper()
	l := Locator{HostRoot: "testdata/" + scenario, Getenv: func(string) string { return "" }}
	in := l.Collect(version)
	if in.ToolkitErr != nil || in.ContainerdErr != nil {
		t.Fatalf("collect: %v / %v", in.ToolkitErr, in.ContainerdErr)
	}
	return BuildReport(in)
}

func statuses(r *Report) map[string]Status {
	m := map[string]Status{}
	for _, c := range r.Checks {
		m[c.ID] = c.Status
	}
	return m
}

func TestReportOnSampleNodes(t *testing.T) {
	cases := []struct {
		scenario, version string
		hardened          bool
		want              map[string]Status
	}{
		{"hardened", "1.17.8", true, map[string]Status{
			CheckToolkitConfig: Pass, CheckEnvvarUnprivileged: Pass, CheckVolumeMounts: Pass,
			CheckRuntimeMode: Pass, CheckLdconfig: Pass, CheckToolkitVersion: Pass,
			CheckContainerdConfig: Pass, CheckNVIDIADefaultRuntime: Pass,
			CheckCDIPodAnnotations: Pass, CheckNRIPlugin: Pass,
			CheckNRIValidator: Warn, CheckEnforcerRequired: Warn,
		}},
		{"default", "1.18.1", false, map[string]Status{
			CheckToolkitConfig: Pass, CheckEnvvarUnprivileged: Fail, CheckVolumeMounts: Warn,
			CheckRuntimeMode: Warn, CheckLdconfig: Pass, CheckToolkitVersion: Fail,
			CheckContainerdConfig: Pass, CheckNVIDIADefaultRuntime: Fail,
			CheckCDIPodAnnotations: Pass, CheckNRIPlugin: Unknown,
			CheckNRIValidator: Warn, CheckEnforcerRequired: Warn,
		}},
		{"inconsistent", "", false, map[string]Status{
			CheckToolkitConfig: Pass, CheckEnvvarUnprivileged: Pass, CheckVolumeMounts: Warn,
			CheckRuntimeMode: Pass, CheckLdconfig: Fail, CheckToolkitVersion: Unknown,
			CheckContainerdConfig: Pass, CheckNVIDIADefaultRuntime: Pass,
			CheckCDIPodAnnotations: Fail, CheckNRIPlugin: Fail,
			CheckNRIValidator: Warn, CheckEnforcerRequired: Warn,
		}},
		{"operator-cdi", "1.18.2", true, map[string]Status{
			CheckToolkitConfig: Pass, CheckEnvvarUnprivileged: Pass, CheckVolumeMounts: Pass,
			CheckRuntimeMode: Pass, CheckLdconfig: Pass, CheckToolkitVersion: Pass,
			CheckContainerdConfig: Pass, CheckNVIDIADefaultRuntime: Pass,
			CheckCDIPodAnnotations: Pass, CheckNRIPlugin: Pass,
			CheckNRIValidator: Warn, CheckEnforcerRequired: Warn,
		}},
	}
	for _, tc := range cases {
		t.Run(tc.scenario, func(t *testing.T) {
			r := collect(t, tc.scenario, tc.version)
			got := statuses(r)
			for id, want := range tc.want {
				if got[id] != want {
					c, _ := r.Get(id)
					t.Errorf("%s: got %s (%q: %s), want %s", id, got[id], c.Value, c.Detail, want)
				}
			}
			if len(got) != len(tc.want) {
				t.Errorf("got %d checks, want %d", len(got), len(tc.want))
			}
			if r.Hardened() != tc.hardened {
				t.Errorf("Hardened() = %v, want %v (%s)", r.Hardened(), tc.hardened, r)
			}
		})
	}
}

func TestFailingChecksSayWhatToChange(t *testing.T) {
	r := collect(t, "default", "1.17.0")
	for _, id := range []string{CheckEnvvarUnprivileged, CheckToolkitVersion} {
		c, _ := r.Get(id)
		if c.Status != Fail {
			t.Fatalf("%s: %s", id, c.Status)
		}
	}
	c, _ := r.Get(CheckEnvvarUnprivileged)
	if !strings.Contains(c.Detail, KeyAcceptEnvvarUnprivileged+" = false") || !strings.Contains(c.Detail, "/etc/nvidia-container-runtime/config.toml") {
		t.Errorf("detail does not say what to set where: %q", c.Detail)
	}
	c, _ = r.Get(CheckToolkitVersion)
	if !strings.Contains(c.Detail, "CVE-2025-23266") {
		t.Errorf("version detail: %q", c.Detail)
	}
}

func TestToolkitConfigLocation(t *testing.T) {
	cases := []struct {
		scenario, override, env, want string
	}{
		{"hardened", "", "", DefaultToolkitConfig},
		{"inconsistent", "", "", OperatorToolkitConfig},
		{"operator-cdi", "", "", "/run/nvidia/toolkit/config.toml"},
		{"operator-cdi", "", "/run/nvidia/toolkit/config.toml", "/run/nvidia/toolkit/config.toml"},
		{"inconsistent", "", "/missing/config.toml", OperatorToolkitConfig},
		{"default", "/etc/nvidia-container-runtime/config.toml", "", DefaultToolkitConfig},
	}
	for _, tc := range cases {
		l := Locator{HostRoot: "testdata/" + tc.scenario, ToolkitConfig: tc.override, Getenv: func(k string) string {
			if k == EnvConfigPath {
				return tc.env
			}
			return ""
		}}
		got, err := l.FindToolkitConfig()
		if err != nil || got != tc.want {
			t.Errorf("%s (override %q, env %q): got %q, %v; want %q", tc.scenario, tc.override, tc.env, got, err, tc.want)
		}
	}
	l := Locator{HostRoot: "testdata/hardened", ToolkitConfig: "/nope.toml"}
	if _, err := l.FindToolkitConfig(); err == nil {
		t.Error("a missing override must be an error")
	}
	l = Locator{HostRoot: t.TempDir(), Getenv: func(string) string { return "" }}
	if p, err := l.FindToolkitConfig(); p != "" || err != nil {
		t.Errorf("empty host: %q %v", p, err)
	}
}

func TestParsedToolkitConfig(t *testing.T) {
	l := Locator{HostRoot: "testdata/operator-cdi", Getenv: func(string) string { return "" }}
	tk, err := l.LoadToolkitConfig()
	if err != nil {
		t.Fatal(err)
	}
	if tk.RuntimeMode != "cdi" || tk.AcceptEnvvarUnprivileged || tk.AcceptVolumeMounts || tk.CDIDefaultKind != "management.nvidia.com/gpu" {
		t.Fatalf("%+v", tk)
	}
	def, err := ParseToolkitConfig([]byte(""), "empty")
	if err != nil {
		t.Fatal(err)
	}
	if !def.AcceptEnvvarUnprivileged || def.AcceptVolumeMounts || def.RuntimeMode != "auto" || def.Ldconfig != "@/sbin/ldconfig" {
		t.Fatalf("defaults: %+v", def)
	}
	if _, err := ParseToolkitConfig([]byte("accept-nvidia-visible-devices-as-volume-mounts = \"yes\""), "bad"); err == nil {
		t.Fatal("a string where a bool belongs must be an error")
	}
	if _, err := ParseToolkitConfig([]byte("[[["), "bad"); err == nil {
		t.Fatal("broken TOML must be an error")
	}
}

func TestContainerdImportsAreMerged(t *testing.T) {
	l := Locator{HostRoot: "testdata/operator-cdi"}
	c, err := l.LoadContainerdConfig()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := c.Runtimes["nvidia-cdi"]; !ok || len(c.Paths) != 2 {
		t.Fatalf("import not merged: %+v", c)
	}
	if c.NRIEnabled == nil || *c.NRIEnabled {
		t.Fatalf("NRI from import: %v", c.NRIEnabled)
	}
	if c.CDIEnabled == nil || !*c.CDIEnabled {
		t.Fatal("containerd 2.x config: CDI is on by default")
	}
}

func TestContainerdV1AndPatterns(t *testing.T) {
	c, err := ParseContainerdConfig([]byte(`
[plugins.cri.containerd]
default_runtime_name = "nvidia-legacy"
[plugins.cri.containerd.runtimes.kata]
pod_annotations = ["*"]
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Version != 1 || !c.NVIDIAIsDefault() {
		t.Fatalf("%+v", c)
	}
	if got := c.CDIAnnotationPassthrough(); len(got) != 1 || got[0] != "kata" {
		t.Fatalf("a '*' pattern passes cdi.k8s.io annotations: %v", got)
	}
	if _, err := ParseContainerdConfig([]byte("version = [")); err == nil {
		t.Fatal("broken TOML must be an error")
	}
}

func TestToolkitVersions(t *testing.T) {
	for in, bad := range map[string]bool{
		"NVIDIA Container Toolkit CLI version 1.17.8\ncommit: abc": false,
		"1.17.7":      true,
		"1.16.2":      true,
		"1.18.0-rc.1": true,
		"1.18.0":      true,
		"1.18.1":      true,
		"1.18.2":      false,
		"1.19.0":      false,
		"2.0.0":       false,
	} {
		v, err := ParseVersion(in)
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		if got := ToolkitVersionProblem(v) != ""; got != bad {
			t.Errorf("%q: problem=%v, want %v", in, got, bad)
		}
	}
	if _, err := ParseVersion("unknown"); err == nil {
		t.Error("no version must be an error")
	}
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	m.Set(collect(t, "default", "1.18.1"))
	if got := gaugeValue(t, m.hardened); got != 0 {
		t.Errorf("hardened gauge %v", got)
	}
	if got := gaugeValue(t, m.check.WithLabelValues(CheckEnvvarUnprivileged, string(Fail))); got != 1 {
		t.Errorf("envvar fail gauge %v", got)
	}
	if got := gaugeValue(t, m.check.WithLabelValues(CheckEnvvarUnprivileged, string(Pass))); got != 0 {
		t.Errorf("envvar pass gauge %v", got)
	}
	m.Set(collect(t, "hardened", "1.17.8"))
	if got := gaugeValue(t, m.hardened); got != 1 {
		t.Errorf("hardened gauge after fix %v", got)
	}
	if got := gaugeValue(t, m.check.WithLabelValues(CheckEnvvarUnprivileged, string(Fail))); got != 0 {
		t.Errorf("envvar fail gauge after fix %v", got)
	}
}

func gaugeValue(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

// TestEnforcerRequiredByContainerd: the report says whether NRI's default
// validator runs and requires the node enforcer, by name or by index and
// name, and names a toleration annotation, which a pod must not be able to
// set.
func TestEnforcerRequiredByContainerd(t *testing.T) {
	const nri = "version = 3\n[plugins.\"io.containerd.nri.v1.nri\"]\ndisable = false\n"
	const validator = "[plugins.\"io.containerd.nri.v1.nri\".default_validator]\n"
	for _, tc := range []struct {
		name, config       string
		validator, require Status
		detail             string
	}{
		{name: "NRI off", config: "version = 3\n[plugins.\"io.containerd.nri.v1.nri\"]\ndisable = true\n", validator: Warn, require: Warn},
		{name: "no validator", config: nri, validator: Warn, require: Warn},
		{name: "validator, nothing required", config: nri + validator + "enable = true\n", validator: Pass, require: Warn},
		{name: "required, not enabled", config: nri + validator + "required_plugins = [\"gpuguard\"]\n", validator: Warn, require: Warn},
		{name: "required", config: nri + validator + "enable = true\nrequired_plugins = [\"gpuguard\"]\n", validator: Pass, require: Pass},
		{name: "required by index and name, tolerable", config: nri + validator +
			"enable = true\nrequired_plugins = [\"90-gpuguard\"]\ntolerate_missing_plugins_annotation = \"gpuguard.io/tolerate-missing-enforcer\"\n",
			validator: Pass, require: Pass, detail: "gpuguard.io/tolerate-missing-enforcer=true"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseContainerdConfig([]byte(tc.config))
			if err != nil {
				t.Fatal(err)
			}
			r := BuildReport(Inputs{Containerd: c})
			v, _ := r.Get(CheckNRIValidator)
			req, _ := r.Get(CheckEnforcerRequired)
			if v.Status != tc.validator || req.Status != tc.require {
				t.Errorf("%s %s (%s), %s %s (%s); want %s, %s", CheckNRIValidator, v.Status, v.Detail, CheckEnforcerRequired, req.Status, req.Detail, tc.validator, tc.require)
			}
			if !strings.Contains(req.Detail, tc.detail) {
				t.Errorf("%s detail %q, want it to name %q", CheckEnforcerRequired, req.Detail, tc.detail)
			}
		})
	}
}
