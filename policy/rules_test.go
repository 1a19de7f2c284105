package policy

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/internal/wellknown"
)

func defaultEngine(t *testing.T, edit func(*config.PolicySpec)) *Engine {
	t.Helper()
	p := config.Default()
	if edit != nil {
		edit(&p.Spec)
	}
	e, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestDeviceEnvProblem(t *testing.T) {
	for _, tc := range []struct {
		gpu    bool
		value  string
		denied bool
	}{
		{false, "void", false}, {false, "", false}, {false, "none", false},
		{false, "all", true}, {false, "0", true}, {false, "GPU-8f2d", true}, {false, "nvidia.com/gpu=all", true},
		{false, "VOID", true}, {false, " void", true}, {false, "$(GPUS)", true}, {false, "0,void", true},
		{true, "void", false}, {true, "", false}, {true, "none", true}, {true, "all", true}, {true, "1", true},
	} {
		got := deviceEnvProblem(tc.gpu, "NVIDIA_VISIBLE_DEVICES", tc.value) != ""
		if got != tc.denied {
			t.Errorf("gpu=%v value=%q: denied=%v, want %v", tc.gpu, tc.value, got, tc.denied)
		}
	}
}

func TestProtectedEnvProblem(t *testing.T) {
	e := defaultEngine(t, nil)
	for _, tc := range []struct {
		gpu         bool
		name, value string
		denied      bool
	}{
		{true, "NVIDIA_DRIVER_CAPABILITIES", "compute,utility", false},
		{true, "NVIDIA_DRIVER_CAPABILITIES", " compute , video ", false},
		{true, "NVIDIA_DRIVER_CAPABILITIES", "", false},
		{true, "NVIDIA_DRIVER_CAPABILITIES", "all", false},
		{true, "NVIDIA_DRIVER_CAPABILITIES", "compute,everything", true},
		{false, "NVIDIA_DRIVER_CAPABILITIES", "compute", true},
		{true, "NVIDIA_MIG_CONFIG_DEVICES", "all", true},
		{true, "NVIDIA_MIG_MONITOR_DEVICES", "0", true},
		{true, "NVIDIA_IMEX_CHANNELS", "0", true},
		{true, "NVIDIA_GDS", "enabled", false},
		{true, "NVIDIA_GDS", "all", true},
		{false, "NVIDIA_GDS", "enabled", true},
		{true, "NVIDIA_GDRCOPY", "enabled", false},
		{false, "NVIDIA_GDRCOPY", "enabled", true},
		{true, "NVIDIA_MOFED", "enabled", true},
		{true, "NVIDIA_NVSWITCH", "enabled", true},
		{false, "NVIDIA_REQUIRE_CUDA", "cuda>=12", false},
		{false, "PATH", "/usr/bin", false},
	} {
		got := e.protectedEnvProblem(tc.gpu, tc.name, tc.value) != ""
		if got != tc.denied {
			t.Errorf("gpu=%v %s=%q: denied=%v, want %v", tc.gpu, tc.name, tc.value, got, tc.denied)
		}
	}
}

func TestGPUContainer(t *testing.T) {
	e := defaultEngine(t, nil)
	limit := func(name, q string) *corev1.Container {
		return &corev1.Container{Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceName(name): resource.MustParse(q)}}}
	}
	for _, tc := range []struct {
		c    *corev1.Container
		want bool
	}{
		{limit("nvidia.com/gpu", "1"), true},
		{limit("nvidia.com/gpu.shared", "2"), true},
		{limit("nvidia.com/mig-1g.10gb", "1"), true},
		{limit("nvidia.com/mig-3g.40gb+me", "1"), true},
		{limit("nvidia.com/gpu", "0"), false},
		{limit("nvidia.com/gpus", "1"), false},
		{limit("example.com/gpu", "1"), false},
		{&corev1.Container{Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}}, false},
		{&corev1.Container{Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}, false},
	} {
		if got := e.isGPUContainer(tc.c); got != tc.want {
			t.Errorf("limits %v requests %v: gpu=%v, want %v", tc.c.Resources.Limits, tc.c.Resources.Requests, got, tc.want)
		}
	}
}

func TestHostPathRelations(t *testing.T) {
	for _, tc := range []struct {
		path string
		want bool
	}{
		{"/dev", true}, {"/dev/", true}, {"/dev/nvidia0", true}, {"/", true}, {"/var", true},
		{"/var/run", true}, {"/run", true}, {"/run/cdi/x.yaml", true}, {"/var/lib/kubelet", true},
		{"/var/lib/kubelet/device-plugins/kubelet.sock", true}, {"//etc//cdi/", true}, {"/etc/../dev", true},
		{"/devices", false}, {"/data", false}, {"/var/lib/kubelet/pods", false}, {"/etc/cdix", false}, {"/var/log", false},
	} {
		p := cleanAbsolute(tc.path)
		got := false
		for _, s := range config.Default().Spec.SensitiveHostPaths {
			got = got || slices.ContainsFunc(HostAliases(s), func(a string) bool { return related(p, a) })
		}
		if got != tc.want {
			t.Errorf("%s: sensitive=%v, want %v", tc.path, got, tc.want)
		}
	}
}

// TestHostAliasesBothWays: /var/run is a symlink to /run, so a policy path and a host
// path are compared under both spellings, and "above" still works for /var.
func TestHostAliasesBothWays(t *testing.T) {
	for _, tc := range []struct {
		sensitive, host string
		want            bool
	}{
		{"/var", "/var/run/secret.sock", true},
		{"/var/run/cdi", "/var", true},
		{"/run/cdi", "/var", true},
		{"/run/cdi", "/var/run/cdi/x", true},
		{"/var/run/cdi", "/run", true},
		{"/var/run/cdi", "/var/lib", false},
	} {
		p := cleanAbsolute(tc.host)
		got := slices.ContainsFunc(HostAliases(tc.sensitive), func(a string) bool { return related(p, a) })
		if got != tc.want {
			t.Errorf("sensitive %s, host path %s: related=%v, want %v", tc.sensitive, tc.host, got, tc.want)
		}
	}
}

func TestModeFor(t *testing.T) {
	for _, tc := range []struct {
		base     config.Mode
		override config.ModeOverride
		label    string
		want     config.Mode
		noted    bool
	}{
		{config.ModeEnforce, config.OverrideTightenOnly, "", config.ModeEnforce, false},
		{config.ModeAudit, config.OverrideTightenOnly, "warn", config.ModeWarn, false},
		{config.ModeAudit, config.OverrideTightenOnly, "enforce", config.ModeEnforce, false},
		{config.ModeEnforce, config.OverrideTightenOnly, "audit", config.ModeEnforce, true},
		{config.ModeEnforce, config.OverrideAny, "audit", config.ModeAudit, false},
		{config.ModeWarn, config.OverrideAny, "bogus", config.ModeWarn, true},
		{config.ModeWarn, config.OverrideTightenOnly, "warn", config.ModeWarn, false},
	} {
		e := defaultEngine(t, func(s *config.PolicySpec) { s.Mode, s.NamespaceModeOverride = tc.base, tc.override })
		labels := map[string]string{}
		if tc.label != "" {
			labels[wellknown.ModeLabel] = tc.label
		}
		got, note := e.modeFor(labels)
		if got != tc.want || (note != "") != tc.noted {
			t.Errorf("%s/%s label %q: mode %s note %q, want %s noted=%v", tc.base, tc.override, tc.label, got, note, tc.want, tc.noted)
		}
	}
}

func TestWarningsKeepTheirFix(t *testing.T) {
	const fix = "remove it or add a GPU limit"
	long := strings.Repeat("é", 60) + "; " + fix
	cronJob := "spec.jobTemplate.spec.template.spec.initContainers[12].env[345]"
	for name, tc := range map[string]struct {
		w    Warning
		want string
	}{
		"fits whole": {Warning{Rule: RuleDeviceEnv, Path: "spec.containers[0].env[1]", Message: "sets X; " + fix},
			"gpuguard device-env: spec.containers[0].env[1]: sets X; " + fix},
		"no path": {Warning{Rule: RuleDeviceEnv, Message: "3 more findings like those above"},
			"gpuguard device-env: 3 more findings like those above"},
		"template path shortened": {Warning{Rule: RuleDriverCapabilitiesAll, Path: cronJob, Message: "asks for all; list only those it needs"},
			"gpuguard driver-capabilities-all: …spec.initContainers[12].env[345]: asks for all; list only those it needs"},
		"what dropped": {Warning{Rule: RuleDeviceEnv, Path: "spec.containers[0].env[1]", Message: long},
			"gpuguard device-env: spec.containers[0].env[1]: " + fix},
		"key elided": {Warning{Rule: RuleInjectorAnnotation, Path: "metadata.annotations[" + strings.Repeat("a", 250) + "/x]", Message: "looks odd; " + fix},
			""},
	} {
		got := tc.w.String()
		if len(got) > MaxWarning || !strings.HasSuffix(got, fix) && !strings.HasSuffix(got, fixClause(tc.w.Message)) {
			t.Errorf("%s: %d bytes, fix lost: %q", name, len(got), got)
		}
		if tc.want != "" && got != tc.want {
			t.Errorf("%s:\n got %q\nwant %q", name, got, tc.want)
		}
	}
	if got := quote(strings.Repeat("x", 100)); len(got) > 40 {
		t.Errorf("quote kept %d bytes", len(got))
	}
	if got := elide("ab"+strings.Repeat("é", 20)+"cd", 11); len(got) > 11 || !utf8.ValidString(got) {
		t.Errorf("elide gave %q (%d bytes)", got, len(got))
	}
}

func TestNothingToSay(t *testing.T) {
	e := defaultEngine(t, nil)
	leak := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "a",
		Env: []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}}}}}
	for name, req := range map[string]*Request{
		"nil object":       {Operation: admissionv1.Create, Phase: Validating},
		"unknown kind":     {Operation: admissionv1.Create, Phase: Validating, Object: &corev1.Service{}},
		"delete":           {Operation: admissionv1.Delete, Phase: Validating, Object: leak},
		"status update":    {Operation: admissionv1.Update, SubResource: "status", Phase: Validating, Object: leak, OldObject: leak},
		"pod env update":   {Operation: admissionv1.Update, Phase: Validating, Object: leak, OldObject: leak},
		"controller patch": {Operation: admissionv1.Create, Phase: Mutating, Object: deploymentOf(leak)},
	} {
		r := e.Evaluate(context.Background(), req)
		if !r.Allowed || len(r.Violations)+len(r.Warnings)+len(r.Patch) != 0 || r.Patch == nil || r.Violations == nil {
			t.Errorf("%s: want allowed untouched with empty (not null) lists, got %+v", name, r)
		}
	}
}

type failingConfigMaps struct{}

func (failingConfigMaps) ConfigMapData(context.Context, string, string) (map[string]string, error) {
	return nil, errors.New("connection refused")
}

func TestConfigMapReadErrorWarns(t *testing.T) {
	e := defaultEngine(t, nil)
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "train",
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}},
		EnvFrom:   []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}}}}}}}}
	r := e.Evaluate(context.Background(), &Request{Operation: admissionv1.Create, Phase: Validating, Object: pod, ConfigMaps: failingConfigMaps{}})
	if !r.Allowed || len(r.Warnings) != 1 || !strings.Contains(r.Warnings[0].Message, "could not be read") {
		t.Errorf("want one warning that the ConfigMap could not be read, got %+v", r)
	}
}

func TestPatchOrder(t *testing.T) {
	e := defaultEngine(t, func(s *config.PolicySpec) { s.Action = config.ActionStrip })
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "a", Env: []corev1.EnvVar{
		{Name: "NVIDIA_VISIBLE_DEVICES", Value: "none"},
		{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"},
		{Name: "KEEP", Value: "1"},
		{Name: "NVIDIA_DRIVER_CAPABILITIES", Value: "all"},
	}}}}}
	r := e.Evaluate(context.Background(), &Request{Operation: admissionv1.Create, Phase: Mutating, Object: pod})
	var got []string
	for _, op := range r.Patch {
		got = append(got, op.Operation+" "+op.Path)
	}
	want := []string{
		"replace /spec/containers/0/env/0/value",
		"remove /spec/containers/0/env/3",
		"remove /spec/containers/0/env/1",
		"add /metadata/annotations",
	}
	// The rewritten "none" is the last remaining NVIDIA_VISIBLE_DEVICES entry, so
	// nothing needs appending; the annotation names the container it voided.
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("patch:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func deploymentOf(pod *corev1.Pod) *appsv1.Deployment {
	return &appsv1.Deployment{Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{Spec: pod.Spec}}}
}
