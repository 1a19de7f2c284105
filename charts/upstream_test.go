//go:build upstream

package charts

import (
	"maps"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/policy"
	"github.com/gpuguard/gpuguard/tools/upstreamchart"
)

// upstreamStack is an upstream chart rendered at a pinned version, and the
// preset that should let its workloads through.
type upstreamStack struct {
	name         string
	source       upstreamchart.Source
	release, ns  string
	values       map[string]any
	preset       string
	presetValues map[string]any
	// want is, per workload ("Kind/name"), the rules gpuguard acts on it
	// with (denial, warning or void) without the preset. A workload not
	// listed needs no GPU: it gets void, with or without the preset.
	want map[string][]policy.RuleID
	// gpuFree: the stack needs no GPU; with the preset it still gets void.
	gpuFree bool
}

// upstreamStacks are the upstream charts this environment can fetch. The
// versions are the newest its Go module proxy serves; docs/compatibility.md
// lists those it refuses.
func upstreamStacks() []upstreamStack {
	return []upstreamStack{
		{
			name: "nvidia-device-plugin with GFD and NFD",
			source: upstreamchart.Source{Module: "github.com/NVIDIA/k8s-device-plugin", Version: "v0.19.0",
				Sum: "h1:3JBGCsq0moOtpqyYHpevGZNcPKmIJeTiL7qSQ/rC71Q=", Dir: "deployments/helm/nvidia-device-plugin"},
			release: "nvdp", ns: "nvidia-device-plugin",
			values: map[string]any{"gfd": map[string]any{"enabled": true}},
			// As its README installs it, without a config: the plugin and
			// the MPS daemon run as the namespace's default account.
			preset: "nvidiaDevicePlugin", presetValues: map[string]any{"exemptDefaultServiceAccount": true},
			want: devicePluginWants,
		},
		{
			name: "nvidia-device-plugin with a config",
			source: upstreamchart.Source{Module: "github.com/NVIDIA/k8s-device-plugin", Version: "v0.19.0",
				Sum: "h1:3JBGCsq0moOtpqyYHpevGZNcPKmIJeTiL7qSQ/rC71Q=", Dir: "deployments/helm/nvidia-device-plugin"},
			release: "nvdp", ns: "nvidia-device-plugin",
			values: map[string]any{"gfd": map[string]any{"enabled": true}, "config": map[string]any{"map": map[string]any{"default": "version: v1\n"}}},
			preset: "nvidiaDevicePlugin",
			// With a config the chart adds its config manager: SYS_ADMIN for
			// the plugin (it signals the plugin's process) and the MIG
			// variables for GFD.
			want: map[string][]policy.RuleID{
				"DaemonSet/nvdp-nvidia-device-plugin": {policy.RuleAddedCapabilities, policy.RuleCapabilities, policy.RuleDeviceEnv, policy.RuleHostPathLink,
					policy.RuleProtectedEnv, policy.RuleSensitiveHostPath},
				"DaemonSet/nvdp-nvidia-device-plugin-gpu-feature-discovery": {policy.RulePrivileged, policy.RuleProtectedEnv,
					policy.RuleSensitiveHostPath},
				"DaemonSet/nvdp-nvidia-device-plugin-mps-control-daemon": devicePluginWants["DaemonSet/nvdp-nvidia-device-plugin-mps-control-daemon"],
			},
		},
		{
			name:    "prometheus-node-exporter",
			source:  promChart("prometheus-node-exporter"),
			release: "kps", ns: "monitoring",
			preset: "nodeExporter", presetValues: map[string]any{"releaseName": "kps"},
			want: map[string][]policy.RuleID{
				// hostPID, with the capabilities and escalation the chart keeps;
				// the node's network, where DCGM's host engine listens.
				"DaemonSet/kps-prometheus-node-exporter": {policy.RuleHostNetworkIPC, policy.RuleNamespaceEntry, policy.RuleSensitiveHostPath},
			},
			gpuFree: true,
		},
		{
			// The chart's defaults run it as nobody:nogroup with a read-only
			// root but keep privilege escalation and capabilities. With those
			// taken away, as kube-prometheus's manifests do (SYS_TIME added to
			// a dropped ALL), its read-only / is admitted without any preset,
			// its groups pinned (supplementalGroupsPolicy: Strict).
			name:    "prometheus-node-exporter hardened",
			source:  promChart("prometheus-node-exporter"),
			release: "kps", ns: "monitoring",
			values: map[string]any{"containerSecurityContext": map[string]any{"readOnlyRootFilesystem": true,
				"allowPrivilegeEscalation": false, "capabilities": map[string]any{"drop": []any{"ALL"}, "add": []any{"SYS_TIME"}}}},
			preset: "nodeExporter", presetValues: map[string]any{"releaseName": "kps"},
			// SYS_TIME is outside allowedCapabilities: the preset waives
			// added-capabilities for it, and host-network-ipc for the
			// node's network the chart keeps (hostNetwork: true).
			want: map[string][]policy.RuleID{
				"DaemonSet/kps-prometheus-node-exporter": {policy.RuleAddedCapabilities, policy.RuleHostNetworkIPC},
			},
			gpuFree: true,
		},
	}
}

// devicePluginWants are the rules gpuguard acts on the device plugin
// chart's workloads with, without the preset.
var devicePluginWants = map[string][]policy.RuleID{
	"DaemonSet/nvdp-nvidia-device-plugin": {policy.RuleDeviceEnv, policy.RuleHostPathLink, policy.RuleProtectedEnv,
		policy.RuleSensitiveHostPath},
	// GFD writes NFD's features.d under /etc, a system directory: a
	// tenant writing there would forge the node's labels.
	"DaemonSet/nvdp-nvidia-device-plugin-gpu-feature-discovery": {policy.RulePrivileged, policy.RuleSensitiveHostPath},
	"DaemonSet/nvdp-nvidia-device-plugin-mps-control-daemon": {policy.RuleDeviceEnv, policy.RuleHostPathLink, policy.RuleNamespaceEntry,
		policy.RulePrivileged, policy.RuleProtectedEnv, policy.RuleSensitiveHostPath},
}

// upstreamWorkload is one pod a rendered chart's controllers would create.
type upstreamWorkload struct {
	name string // Kind/name
	pod  *corev1.Pod
}

func renderUpstream(t *testing.T, st upstreamStack) []upstreamWorkload {
	t.Helper()
	pods := corpusPods(t, corpusSource{name: st.release, source: st.source, ns: st.ns, values: st.values})
	var out []upstreamWorkload
	for _, name := range slices.Sorted(maps.Keys(pods)) {
		pods[name].Namespace = st.ns
		out = append(out, upstreamWorkload{name: name, pod: pods[name]})
	}
	if len(out) == 0 {
		t.Fatalf("%s rendered no workload", st.source)
	}
	return out
}

// firedRules lists the rules behind what gpuguard does to pod: denials,
// warnings, and void (inject-void, when the result carries a patch).
func firedRules(t *testing.T, e *policy.Engine, pod *corev1.Pod, ns, sa string) []policy.RuleID {
	t.Helper()
	r := admit(t, e, pod, ns, sa)
	set := map[policy.RuleID]bool{}
	for _, v := range r.Violations {
		set[v.Rule] = true
	}
	// Rules whose findings fell beyond policy.MaxFindings deny all the same.
	for _, rule := range r.OmittedRules {
		set[rule] = true
	}
	for _, w := range r.Warnings {
		set[w.Rule] = true
	}
	if len(r.Patch) > 0 {
		set[policy.RuleInjectVoid] = true
	}
	return slices.Sorted(maps.Keys(set))
}

// TestUpstreamCharts renders each upstream chart as its README installs it
// and runs every pod its controllers would create through gpuguard: without
// the preset, exactly the expected rules act on it; with the preset, the
// stack's own workloads are admitted unchanged (the ones that need no GPU
// get void, harmlessly); and the same pods in a tenant's namespace, or under
// another service account of the stack's namespace, are still judged as
// without it.
func TestUpstreamCharts(t *testing.T) {
	gg := loadChart(t)
	without, err := policy.New(config.Default())
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range upstreamStacks() {
		t.Run(st.name, func(t *testing.T) {
			presetValues := map[string]any{"enabled": true}
			maps.Copy(presetValues, st.presetValues)
			with, err := policy.New(renderedEnforcingPolicy(t, gg, map[string]any{"policy": map[string]any{"presets": map[string]any{st.preset: presetValues}}}))
			if err != nil {
				t.Fatal(err)
			}
			seen := map[string]bool{}
			for _, w := range renderUpstream(t, st) {
				seen[w.name] = true
				sa := w.pod.Spec.ServiceAccountName
				want := st.want[w.name]
				if want == nil {
					want = []policy.RuleID{policy.RuleInjectVoid}
				}
				if got := firedRules(t, without, w.pod, st.ns, sa); !slices.Equal(got, want) {
					t.Errorf("%s as %s without the preset: gpuguard acts with %v, want %v", w.name, sa, got, want)
				}
				if st.want[w.name] == nil {
					continue // needs no GPU and no exemption: void does it no harm
				}
				var harmless []policy.RuleID
				if st.gpuFree {
					harmless = []policy.RuleID{policy.RuleInjectVoid}
				}
				if got := firedRules(t, with, w.pod, st.ns, sa); len(got) != 0 && !slices.Equal(got, harmless) {
					t.Errorf("%s as %s with the preset: gpuguard acts with %v, want it admitted unchanged", w.name, sa, got)
				}
				for _, attack := range []struct{ ns, sa string }{{"tenant", sa}, {st.ns, "intruder"}} {
					if got := firedRules(t, with, w.pod, attack.ns, attack.sa); !slices.Equal(got, want) {
						t.Errorf("%s in %s as %s with the preset: gpuguard acts with %v, want %v as without it", w.name, attack.ns, attack.sa, got, want)
					}
				}
			}
			for name := range st.want {
				if !seen[name] {
					t.Errorf("%s rendered no %s: the test's expectations are out of date", st.source, name)
				}
			}
		})
	}
}
