package charts

import (
	"context"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/policy"
	"github.com/gpuguard/gpuguard/tools/chartrender"
)

// presetCase is a preset turned on, the exemptions its upstream chart's
// names call for, and a pod shaped like that stack's workload (what gpuguard
// denies or changes in it: NVIDIA_VISIBLE_DEVICES=all, host paths, privilege).
type presetCase struct {
	preset string
	values map[string]any
	// want are the exempt service accounts, all in namespace.
	namespace string
	want      []string
	pod       func() *corev1.Pod
	// gpuFree: the stack needs no GPU, and keeps getting void.
	gpuFree bool
}

func presetCases() []presetCase {
	return []presetCase{
		{"nvidiaDevicePlugin", nil, "nvidia-device-plugin", []string{"nvdp-nvidia-device-plugin-service-account"}, devicePluginPod, false},
		{"nvidiaDevicePlugin", map[string]any{"namespace": "gpu-feature-discovery", "releaseName": "nvidia-device-plugin"},
			"gpu-feature-discovery", []string{"nvidia-device-plugin-service-account"}, devicePluginPod, false},
		{"nvidiaDevicePlugin", map[string]any{"exemptDefaultServiceAccount": true}, "nvidia-device-plugin",
			[]string{"nvdp-nvidia-device-plugin-service-account", "default"}, devicePluginPod, false},
		{"nvidiaDRADriver", nil, "dra-driver-nvidia-gpu", []string{"dra-driver-nvidia-gpu-service-account-kubeletplugin",
			"dra-driver-nvidia-gpu-service-account-controller", "compute-domain-daemon-service-account"}, draPluginPod, false},
		{"nvidiaDRADriver", map[string]any{"namespace": "nvidia-dra-driver-gpu", "releaseName": "nvidia-dra-driver-gpu", "chartName": "nvidia-dra-driver-gpu"},
			"nvidia-dra-driver-gpu", []string{"nvidia-dra-driver-gpu-service-account-kubeletplugin",
				"nvidia-dra-driver-gpu-service-account-controller", "compute-domain-daemon-service-account"}, draPluginPod, false},
		{"dcgmExporter", nil, "dcgm-exporter", []string{"dcgm-exporter"}, dcgmExporterPod, false},
		{"dcgmExporter", map[string]any{"releaseName": "dcgm-exporter-1712345678"}, "dcgm-exporter", []string{"dcgm-exporter-1712345678"}, dcgmExporterPod, false},
		{"nodeExporter", map[string]any{"releaseName": "kps"}, "monitoring", []string{"kps-prometheus-node-exporter"}, nodeExporterPod, true},
		{"migManager", nil, "nvidia-mig-manager", []string{"nvidia-mig-manager-service-account"}, migManagerPod, false},
	}
}

// TestPresets: each preset exempts its namespace paired with the service
// accounts its upstream chart creates for the given release, never a whole
// namespace, and from the rules it names alone; with it, the stack's pod is
// admitted unchanged (but for void, where the stack needs no GPU); with a
// CDI annotation no preset waives, it is denied; without the preset, or in
// another namespace, or under another service account, gpuguard still acts
// on the same pod.
func TestPresets(t *testing.T) {
	c := loadChart(t)
	for _, pc := range presetCases() {
		t.Run(pc.preset+"/"+strings.Join(pc.want, ","), func(t *testing.T) {
			values := map[string]any{"enabled": true}
			for k, v := range pc.values {
				values[k] = v
			}
			p := renderedPolicy(t, c, map[string]any{"policy": map[string]any{"mode": "enforce", "presets": map[string]any{pc.preset: values}}})
			if len(p.Spec.Exemptions.Namespaces) != 0 {
				t.Errorf("a preset must not exempt whole namespaces: %v", p.Spec.Exemptions.Namespaces)
			}
			var got []string
			for _, sa := range p.Spec.Exemptions.ServiceAccounts {
				if sa.Namespace != pc.namespace {
					t.Errorf("exemption %+v outside %s", sa, pc.namespace)
				}
				got = append(got, sa.Name)
			}
			if !slices.Equal(got, pc.want) {
				t.Errorf("exempt service accounts %v, want %v", got, pc.want)
			}
			engine, err := policy.New(p)
			if err != nil {
				t.Fatal(err)
			}
			for _, sa := range p.Spec.Exemptions.ServiceAccounts {
				if len(sa.Rules) == 0 {
					t.Errorf("exemption %s/%s waives every rule: a preset names what its stack needs", sa.Namespace, sa.Name)
				}
			}
			pod := pc.pod()
			r := admit(t, engine, pod, pc.namespace, pc.want[0])
			if !r.Allowed || len(r.Warnings) > 0 || r.AuditAnnotations["waived"] == "" || (len(r.Patch) > 0 && !pc.gpuFree) {
				t.Errorf("with the preset, the stack's pod must be admitted unchanged under its waiver: %+v", r)
			}
			annotated := pod.DeepCopy()
			annotated.Annotations = map[string]string{"cdi.k8s.io/forged": "nvidia.com/gpu=all"}
			if r := admit(t, engine, annotated, pc.namespace, pc.want[0]); r.Allowed {
				t.Errorf("with the preset, the stack's account must still be denied what the preset does not waive: %+v", r)
			}
			for _, attack := range []struct{ ns, sa string }{{"tenant", pc.want[0]}, {pc.namespace, "intruder"}} {
				if r := admit(t, engine, pod, attack.ns, attack.sa); r.Exempt != "" || r.AuditAnnotations["waived"] != "" || (r.Allowed && len(r.Patch) == 0) {
					t.Errorf("the same pod in %s as %s must still be judged: %+v", attack.ns, attack.sa, r)
				}
			}
			without, err := policy.New(config.Default())
			if err != nil {
				t.Fatal(err)
			}
			if r := admit(t, without, pod, pc.namespace, pc.want[0]); r.Allowed && len(r.Patch) == 0 {
				t.Error("without the preset gpuguard must act on the stack's pod; the fixture is not shaped like it")
			}
		})
	}
}

// TestGPUSharingPresets: each GPU-sharing stack's resource names count as
// GPU resources, so a container asking for one is not given void, which
// would override the NVIDIA_VISIBLE_DEVICES its device plugin sets (for
// HAMi, a container asking only for GPU memory, which HAMi's webhook gives
// nvidia.com/gpu later); without the preset it is.
func TestGPUSharingPresets(t *testing.T) {
	c := loadChart(t)
	for _, tc := range []struct{ preset, resource string }{
		{"hami", "nvidia.com/gpumem"},
		{"volcanoVGPU", "volcano.sh/vgpu-number"},
		{"volcanoVGPU", "volcano.sh/gpu-memory"},
		{"aliyunGPUShare", "aliyun.com/gpu-mem"},
	} {
		t.Run(tc.preset+"/"+tc.resource, func(t *testing.T) {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "llm"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{
				Name: "llm", Image: "vllm", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceName(tc.resource): resource.MustParse("2")}}}}}}
			with := renderedPolicy(t, c, map[string]any{"policy": map[string]any{"presets": map[string]any{tc.preset: map[string]any{"enabled": true}}}})
			if !slices.Contains(with.Spec.GPUResources, "nvidia.com/gpu") || !slices.Contains(with.Spec.GPUResources, tc.resource) {
				t.Fatalf("gpuResources %v: want the defaults and %s", with.Spec.GPUResources, tc.resource)
			}
			for _, pc := range []struct {
				p        *config.Policy
				wantVoid bool
			}{{with, false}, {config.Default(), true}} {
				engine, err := policy.New(pc.p)
				if err != nil {
					t.Fatal(err)
				}
				r := admit(t, engine, pod, "team", "default")
				if voided := len(r.Patch) > 0; voided != pc.wantVoid || !r.Allowed {
					t.Errorf("gpuResources %v: patched %v, want %v (%+v)", pc.p.Spec.GPUResources, voided, pc.wantVoid, r)
				}
			}
		})
	}
}

// TestGPUSharingPresetsCombine: two sharing presets and a policy's own
// gpuResources add up rather than replace one another.
func TestGPUSharingPresetsCombine(t *testing.T) {
	p := renderedPolicy(t, loadChart(t), map[string]any{"policy": map[string]any{
		"spec":    map[string]any{"gpuResources": []any{"nvidia.com/gpu", "example.com/gpu"}},
		"presets": map[string]any{"hami": map[string]any{"enabled": true}, "aliyunGPUShare": map[string]any{"enabled": true}}}})
	for _, want := range []string{"nvidia.com/gpu", "example.com/gpu", "nvidia.com/gpucores", "aliyun.com/gpu-mem"} {
		if !slices.Contains(p.Spec.GPUResources, want) {
			t.Errorf("gpuResources %v: want %s", p.Spec.GPUResources, want)
		}
	}
	if slices.Contains(p.Spec.GPUResources, "volcano.sh/vgpu-number") {
		t.Errorf("gpuResources %v: volcanoVGPU is off", p.Spec.GPUResources)
	}
}

// TestPresetsExemptServiceAccountsNotNamespaces: a preset exempts its
// stack's service accounts, in the policy the agent reads, and never its
// whole namespace: the agent is given no preset's namespace to exempt, so
// another pod in that namespace is judged by the verifier and the node
// enforcer as anywhere else. Before, every enabled preset's namespace was
// passed whole (--verify-exempt-namespaces), and the enforcer left each
// of its containers alone.
func TestPresetsExemptServiceAccountsNotNamespaces(t *testing.T) {
	c := loadChart(t)
	values := map[string]any{"policy": map[string]any{"presets": map[string]any{
		"nvidiaDevicePlugin": map[string]any{"enabled": true}, "dcgmExporter": map[string]any{"enabled": true}, "nodeExporter": map[string]any{"enabled": true}}}}
	r, err := chartrender.Render(c, releaseName, namespace, values, clusterAPIs...)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(r.Raw, "--verify-exempt-namespaces") {
		t.Error("the agent must exempt no preset's whole namespace")
	}
	p := renderedPolicy(t, c, values)
	for _, ns := range []string{"nvidia-device-plugin", "dcgm-exporter"} {
		if slices.Contains(p.Spec.Exemptions.Namespaces, ns) {
			t.Errorf("the policy exempts namespace %s whole", ns)
		}
		found := false
		for _, ex := range p.Spec.Exemptions.ServiceAccounts {
			found = found || ex.Namespace == ns
		}
		if !found {
			t.Errorf("the policy exempts no service account of %s: %+v", ns, p.Spec.Exemptions.ServiceAccounts)
		}
	}
}

func renderedPolicy(t *testing.T, c *chart.Chart, values map[string]any) *config.Policy {
	t.Helper()
	r, err := render(t, c, values)
	if err != nil {
		t.Fatal(err)
	}
	cm := policyConfigMap(t, r)
	p, err := config.Load("chart", []byte(cm.Data[config.ConfigMapKey]))
	if err != nil {
		t.Fatalf("the rendered policy does not load: %v\n%s", err, cm.Data[config.ConfigMapKey])
	}
	return p
}

// renderedEnforcingPolicy is renderedPolicy with policy.mode=enforce: the
// corpora compare a preset's policy with the built-in one, which enforces,
// where the chart's own default mode (warn) would deny nothing.
func renderedEnforcingPolicy(t *testing.T, c *chart.Chart, values map[string]any) *config.Policy {
	t.Helper()
	pv, _ := values["policy"].(map[string]any)
	merged := map[string]any{"mode": "enforce"}
	for k, v := range pv {
		merged[k] = v
	}
	return renderedPolicy(t, c, map[string]any{"policy": merged})
}

func admit(t *testing.T, e *policy.Engine, pod *corev1.Pod, ns, sa string) policy.Result {
	t.Helper()
	p := pod.DeepCopy()
	p.Namespace, p.Spec.ServiceAccountName = ns, sa
	r, err := e.Admit(context.Background(), policy.Request{Operation: "CREATE", Namespace: ns, Object: p})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func hostPath(name, path string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path}}}
}

var privileged = &corev1.SecurityContext{Privileged: new(true)}

// devicePluginPod is shaped like the device plugin chart's DaemonSet: the
// NVIDIA runtime's variables and the kubelet's plugin directory.
func devicePluginPod() *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "nvdp"}, Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "nvidia-device-plugin-ctr", Image: "k8s-device-plugin",
			Env:          []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}, {Name: "NVIDIA_MIG_MONITOR_DEVICES", Value: "all"}},
			VolumeMounts: []corev1.VolumeMount{{Name: "device-plugin", MountPath: "/var/lib/kubelet/device-plugins"}}}},
		Volumes: []corev1.Volume{hostPath("device-plugin", "/var/lib/kubelet/device-plugins")}}}
}

// draPluginPod is shaped like the DRA driver's kubelet plugin: privileged,
// with the kubelet's plugin directories and the driver root at /.
func draPluginPod() *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "dra"}, Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "gpus", Image: "dra-driver", SecurityContext: privileged,
			Env: []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "void"}, {Name: "NVIDIA_MIG_CONFIG_DEVICES", Value: "all"}}}},
		Volumes: []corev1.Volume{hostPath("plugins", "/var/lib/kubelet/plugins"), hostPath("driver-root", "/")}}}
}

// dcgmExporterPod is shaped like the DCGM exporter: no GPU limit and
// nothing in its spec (its image sets NVIDIA_VISIBLE_DEVICES=all), so
// gpuguard would give it void.
func dcgmExporterPod() *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "dcgm-exporter"}, Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "exporter", Image: "dcgm-exporter",
			SecurityContext: &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"SYS_ADMIN"}}}}}}}
}

// nodeExporterPod mounts the host's / read-only.
func nodeExporterPod() *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "node-exporter"}, Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "node-exporter", Image: "node-exporter",
			VolumeMounts: []corev1.VolumeMount{{Name: "root", MountPath: "/host/root", ReadOnly: true}}}},
		Volumes: []corev1.Volume{hostPath("root", "/")}}}
}

// migManagerPod is privileged with the host's / mounted.
func migManagerPod() *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "mig-manager"}, Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "nvidia-mig-manager", Image: "k8s-mig-manager", SecurityContext: privileged}},
		Volumes:    []corev1.Volume{hostPath("host-root", "/")}}}
}

// TestKAISchedulerPreset: one value turns on KAI's fractions with the
// binder's account as the only writer of their ConfigMaps; it needs the
// backstop, whose ConfigMap guard holds that.
func TestKAISchedulerPreset(t *testing.T) {
	c := loadChart(t)
	p := renderedPolicy(t, c, map[string]any{"policy": map[string]any{"presets": map[string]any{"kaiScheduler": map[string]any{"enabled": true}}}})
	k := p.Spec.Integrations.KAIScheduler
	if !k.Fractions || !slices.Equal(k.SchedulerNames, []string{"kai-scheduler"}) ||
		!slices.Equal(k.BinderServiceAccounts, []string{"system:serviceaccount:kai-scheduler:binder"}) {
		t.Errorf("kaiScheduler preset rendered %+v", k)
	}
	if len(p.Spec.Exemptions.ServiceAccounts)+len(p.Spec.Exemptions.Namespaces) != 0 {
		t.Errorf("the KAI preset must exempt nothing: %+v", p.Spec.Exemptions)
	}
	if def := config.Default().Spec.Integrations.KAIScheduler; def.Fractions {
		t.Error("the KAI integration must be off by default")
	}
	preset := map[string]any{"presets": map[string]any{"kaiScheduler": map[string]any{"enabled": true}}}
	spec := map[string]any{"spec": map[string]any{"integrations": map[string]any{"kaiScheduler": map[string]any{"fractions": true}}}}
	document := map[string]any{"document": "apiVersion: gpuguard.io/v1alpha1\nkind: GPUGuardPolicy\nmetadata:\n  name: d\nspec:\n  integrations:\n    kaiScheduler:\n      fractions: true\n"}
	noMAP := []string{"admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"}
	noAdmissionPolicies := []string{"apps/v1"} // before Kubernetes 1.30
	for name, tc := range map[string]struct {
		policy   map[string]any
		backstop bool
		apis     []string
	}{
		"the preset, backstop off":                             {preset, false, clusterAPIs},
		"policy.spec, backstop off":                            {spec, false, clusterAPIs},
		"policy.document, no admission policies served":        {document, true, noAdmissionPolicies},
		"the preset, backstop off, no MAP in the cluster":      {preset, false, noMAP},
		"the preset, backstop on, no admission policies":       {preset, true, noAdmissionPolicies},
		"policy.spec, backstop on, no admission policies":      {spec, true, noAdmissionPolicies},
		"policy.document, backstop off, no MAP in the cluster": {document, false, noMAP},
	} {
		values := map[string]any{"backstop": map[string]any{"enabled": tc.backstop}, "policy": tc.policy}
		_, err := chartrender.Render(c, releaseName, namespace, values, tc.apis...)
		if err == nil || !strings.Contains(err.Error(), "KAI fractions") {
			t.Errorf("%s: KAI fractions without their guard in force must be refused, got %v", name, err)
		}
	}
	// Kubernetes 1.30 to 1.35: the guard alone, a ValidatingAdmissionPolicy.
	for name, policy := range map[string]map[string]any{"the preset": preset, "policy.spec": spec, "policy.document": document} {
		r, err := chartrender.Render(c, releaseName, namespace, map[string]any{"backstop": map[string]any{"enabled": true}, "policy": policy}, noMAP...)
		if err != nil {
			t.Errorf("%s, no MAP in the cluster: the KAI guard alone must be rendered: %v", name, err)
			continue
		}
		if !strings.Contains(r.Raw, "- --cel-backstop-kai-guard-only") || !strings.Contains(r.Raw, "- --cel-backstop\n") {
			t.Errorf("%s, no MAP in the cluster: the webhook must apply the guard alone", name)
		}
		if !strings.Contains(r.Raw, "-backstop-kai-configmaps") || strings.Contains(r.Raw, "mutatingadmissionpolicies") {
			t.Errorf("%s, no MAP in the cluster: RBAC must name the guard, and no MutatingAdmissionPolicy", name)
		}
	}
	r, err := chartrender.Render(c, releaseName, namespace, map[string]any{"backstop": map[string]any{"enabled": true}}, noMAP...)
	if err != nil || strings.Contains(r.Raw, "kai-guard-only") || strings.Contains(r.Raw, "- --cel-backstop\n") {
		t.Errorf("without KAI fractions nothing of the backstop runs where MAP is not served: %v", err)
	}
}

// TestGPUOperatorNVIDIADrivers: the GPU Operator preset exempts the driver
// DaemonSets of the NVIDIADriver resources it is told about, by the names
// the operator gives their service accounts, in the operator's namespace.
func TestGPUOperatorNVIDIADrivers(t *testing.T) {
	c := loadChart(t)
	p := renderedPolicy(t, c, map[string]any{"policy": map[string]any{"mode": "enforce", "presets": map[string]any{"gpuOperator": map[string]any{
		"enabled": true, "namespace": "nvidia-gpu-operator",
		"nvidiaDrivers": map[string]any{"names": []any{"default", "a100"}, "driverTypes": []any{"gpu", "vgpu-host-manager"}, "osTags": []any{"ubuntu22.04", "rhel9"}},
	}}}})
	got := map[string]bool{}
	for _, sa := range p.Spec.Exemptions.ServiceAccounts {
		if sa.Namespace != "nvidia-gpu-operator" {
			t.Errorf("exemption %+v outside the operator's namespace", sa)
		}
		got[sa.Name] = true
	}
	for _, want := range []string{"nvidia-gpu-driver-default-ubuntu22.04", "nvidia-gpu-driver-a100-rhel9",
		"nvidia-vgpu-manager-default-rhel9", "nvidia-vgpu-manager-a100-ubuntu22.04", "nvidia-driver", "nvidia-dra-driver-kubeletplugin"} {
		if !got[want] {
			t.Errorf("no exemption for %s; have %v", want, got)
		}
	}
	engine, err := policy.New(p)
	if err != nil {
		t.Fatal(err)
	}
	driver := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "nvidia-gpu-driver-ubuntu22.04-5f8b9"}, Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "nvidia-driver-ctr", Image: "driver", SecurityContext: privileged}},
		Volumes:    []corev1.Volume{hostPath("run-nvidia", "/run/nvidia")}}}
	if r := admit(t, engine, driver, "nvidia-gpu-operator", "nvidia-gpu-driver-default-ubuntu22.04"); !r.Allowed || r.AuditAnnotations["waived"] == "" {
		t.Errorf("the default NVIDIADriver's driver pod must be exempt: %+v", r)
	}
	for _, attack := range []struct{ ns, sa string }{{"nvidia-gpu-operator", "nvidia-gpu-driver-other-ubuntu22.04"}, {"tenant", "nvidia-gpu-driver-default-ubuntu22.04"}} {
		if r := admit(t, engine, driver, attack.ns, attack.sa); r.Allowed {
			t.Errorf("a driver-shaped pod in %s as %s must be denied", attack.ns, attack.sa)
		}
	}
}
