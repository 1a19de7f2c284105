package charts

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/klog/v2"

	"helm.sh/helm/v3/pkg/chartutil"
)

// simNode is a node as a platform creates it: its labels and taints.
type simNode struct {
	name   string
	labels map[string]string
	taints []corev1.Taint
}

var (
	gpuTaint = corev1.Taint{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}
	skuTaint = corev1.Taint{Key: "sku", Value: "gpu", Effect: corev1.TaintEffectNoSchedule}
	// The taint Karpenter's and EKS Auto Mode's GPU NodePools document.
	gpuTaintNoValue = corev1.Taint{Key: "nvidia.com/gpu", Effect: corev1.TaintEffectNoSchedule}
)

// platformNodes are each platform's default GPU nodes, which the agent must
// run on, and its CPU nodes, which it must not.
var platformNodes = map[string]struct{ gpu, cpu []simNode }{
	"generic": {
		gpu: []simNode{
			{"gfd", map[string]string{"nvidia.com/gpu.present": "true"}, []corev1.Taint{gpuTaint}},
			{"nfd", map[string]string{"feature.node.kubernetes.io/pci-10de.present": "true"}, nil},
		},
		cpu: []simNode{
			{"cpu", map[string]string{"kubernetes.io/os": "linux"}, nil},
			{"gke-gpu-without-profile", map[string]string{"cloud.google.com/gke-accelerator": "nvidia-l4"}, []corev1.Taint{gpuTaint}},
		},
	},
	"eks": {
		gpu: []simNode{
			// A managed node group labelled as the cluster autoscaler expects.
			{"managed-node-group", map[string]string{"k8s.amazonaws.com/accelerator": "nvidia-tesla-a10g", "node.kubernetes.io/instance-type": "g5.xlarge"}, nil},
			{"karpenter", map[string]string{"karpenter.k8s.aws/instance-gpu-manufacturer": "nvidia", "karpenter.k8s.aws/instance-gpu-count": "1"}, []corev1.Taint{gpuTaintNoValue}},
			{"auto-mode", map[string]string{"eks.amazonaws.com/instance-gpu-manufacturer": "nvidia", "eks.amazonaws.com/compute-type": "auto"}, []corev1.Taint{gpuTaintNoValue}},
			{"gpu-operator", map[string]string{"nvidia.com/gpu.present": "true"}, nil},
		},
		cpu: []simNode{
			{"cpu", map[string]string{"node.kubernetes.io/instance-type": "m5.large", "eks.amazonaws.com/nodegroup": "system"}, nil},
			{"neuron", map[string]string{"karpenter.k8s.aws/instance-gpu-manufacturer": "aws"}, nil},
		},
	},
	"gke": {
		gpu: []simNode{
			{"l4", map[string]string{"cloud.google.com/gke-accelerator": "nvidia-l4", "cloud.google.com/gke-gpu-driver-version": "default"}, []corev1.Taint{gpuTaint}},
		},
		cpu: []simNode{{"cpu", map[string]string{"cloud.google.com/gke-nodepool": "default-pool"}, nil}},
	},
	"aks": {
		gpu: []simNode{
			{"sku-tainted", map[string]string{"kubernetes.azure.com/accelerator": "nvidia", "kubernetes.azure.com/agentpool": "gpunp"}, []corev1.Taint{skuTaint}},
			{"untainted", map[string]string{"kubernetes.azure.com/accelerator": "nvidia"}, nil},
		},
		cpu: []simNode{{"cpu", map[string]string{"kubernetes.azure.com/agentpool": "nodepool1"}, nil}},
	},
	"openshift": {
		gpu: []simNode{
			{"nfd-gfd", map[string]string{"feature.node.kubernetes.io/pci-10de.present": "true", "nvidia.com/gpu.present": "true", "node-role.kubernetes.io/worker": ""}, nil},
		},
		cpu: []simNode{{"worker", map[string]string{"node-role.kubernetes.io/worker": ""}, nil}},
	},
	"k3s": {
		gpu: []simNode{{"gfd", map[string]string{"nvidia.com/gpu.present": "true", "node.kubernetes.io/instance-type": "k3s"}, nil}},
		cpu: []simNode{{"cpu", map[string]string{"node.kubernetes.io/instance-type": "k3s"}, nil}},
	},
	"rke2": {
		gpu: []simNode{{"nfd", map[string]string{"feature.node.kubernetes.io/pci-10de.present": "true", "node.kubernetes.io/instance-type": "rke2"}, nil}},
		cpu: []simNode{{"cpu", map[string]string{"node.kubernetes.io/instance-type": "rke2"}, nil}},
	},
}

var nodeSelectorOps = map[corev1.NodeSelectorOperator]selection.Operator{
	corev1.NodeSelectorOpIn:           selection.In,
	corev1.NodeSelectorOpNotIn:        selection.NotIn,
	corev1.NodeSelectorOpExists:       selection.Exists,
	corev1.NodeSelectorOpDoesNotExist: selection.DoesNotExist,
	corev1.NodeSelectorOpGt:           selection.GreaterThan,
	corev1.NodeSelectorOpLt:           selection.LessThan,
}

// schedulable says whether the scheduler would place a pod of spec on n as
// far as labels and taints go: nodeSelector, required node affinity (terms
// ORed, their expressions ANDed) and NoSchedule/NoExecute taints.
func schedulable(spec corev1.PodSpec, n simNode) (bool, string) {
	set := labels.Set(n.labels)
	if !labels.SelectorFromSet(spec.NodeSelector).Matches(set) {
		return false, "nodeSelector"
	}
	if a := spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		matched := false
		for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
			if len(term.MatchFields) > 0 {
				return false, "matchFields are not simulated"
			}
			sel := labels.NewSelector()
			for _, e := range term.MatchExpressions {
				r, err := labels.NewRequirement(e.Key, nodeSelectorOps[e.Operator], e.Values)
				if err != nil {
					return false, err.Error()
				}
				sel = sel.Add(*r)
			}
			if len(term.MatchExpressions) > 0 && sel.Matches(set) {
				matched = true
				break
			}
		}
		if !matched {
			return false, "node affinity"
		}
	}
	for i := range n.taints {
		taint := &n.taints[i]
		if taint.Effect == corev1.TaintEffectPreferNoSchedule {
			continue
		}
		if !slices.ContainsFunc(spec.Tolerations, func(tol corev1.Toleration) bool {
			return tol.ToleratesTaint(klog.Background(), taint, false)
		}) {
			return false, "taint " + taint.ToString()
		}
	}
	return true, ""
}

func platformRelease(t *testing.T, platform, extra string) []runtime.Object {
	t.Helper()
	r, err := render(t, loadChart(t), parseValues(t, fmt.Sprintf("platform: %s\n%s", platform, extra)))
	if err != nil {
		t.Fatalf("platform %s: %v", platform, err)
	}
	return decodeAll(t, docs(r, false))
}

// TestPlatformScheduling: on each platform the agent's DaemonSet admits the
// platform's default GPU nodes (labels and taints as the platform sets
// them) and no CPU node.
func TestPlatformScheduling(t *testing.T) {
	for platform, nodes := range platformNodes {
		t.Run(platform, func(t *testing.T) {
			ds := one[*appsv1.DaemonSet](t, platformRelease(t, platform, ""))
			spec := ds.Spec.Template.Spec
			for _, n := range nodes.gpu {
				if ok, why := schedulable(spec, n); !ok {
					t.Errorf("GPU node %s refused the agent (%s): affinity %+v, tolerations %+v", n.name, why, spec.Affinity, spec.Tolerations)
				}
			}
			for _, n := range nodes.cpu {
				if ok, _ := schedulable(spec, n); ok {
					t.Errorf("CPU node %s admits the agent", n.name)
				}
			}
		})
	}
}

func containerArg(c corev1.Container, flag string) (string, bool) {
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v, true
		}
	}
	return "", false
}

// TestPlatformProfiles: what each profile sets besides placement.
func TestPlatformProfiles(t *testing.T) {
	for _, tc := range []struct {
		platform, runtimeClass, nvml, cri, containerd string
		aksAnnotation, scc, quota                     bool
	}{
		{platform: "generic", runtimeClass: "nvidia"},
		{platform: "eks"},
		{platform: "gke", nvml: "/host/home/kubernetes/bin/nvidia/lib64/libnvidia-ml.so.1", quota: true},
		{platform: "aks", aksAnnotation: true},
		{platform: "openshift", runtimeClass: "nvidia", scc: true},
		{platform: "k3s", runtimeClass: "nvidia", cri: "/host/run/k3s/containerd/containerd.sock", containerd: "/var/lib/rancher/k3s/agent/etc/containerd/config.toml"},
		{platform: "rke2", runtimeClass: "nvidia", cri: "/host/run/k3s/containerd/containerd.sock", containerd: "/var/lib/rancher/rke2/agent/etc/containerd/config.toml"},
	} {
		t.Run(tc.platform, func(t *testing.T) {
			objs := platformRelease(t, tc.platform, "")
			ds := one[*appsv1.DaemonSet](t, objs)
			spec := ds.Spec.Template.Spec
			if got := ptrString(spec.RuntimeClassName); got != tc.runtimeClass {
				t.Errorf("runtimeClassName %q, want %q", got, tc.runtimeClass)
			}
			c := spec.Containers[0]
			for flag, want := range map[string]string{"--nvml-library": tc.nvml, "--cri-endpoint": tc.cri, "--containerd-config": tc.containerd} {
				if got, _ := containerArg(c, flag); got != want {
					t.Errorf("%s=%q, want %q", flag, got, want)
				}
			}
			var hooks []map[string]string
			for _, m := range findAll[*admissionv1.MutatingWebhookConfiguration](objs) {
				hooks = append(hooks, m.Annotations)
			}
			for _, v := range findAll[*admissionv1.ValidatingWebhookConfiguration](objs) {
				hooks = append(hooks, v.Annotations)
			}
			if len(hooks) != 2 {
				t.Fatalf("%d webhook configurations, want 2", len(hooks))
			}
			for _, a := range hooks {
				if got := a["admissions.enforcer/disabled"] == "true"; got != tc.aksAnnotation {
					t.Errorf("admissions.enforcer/disabled on a webhook configuration: %v, want %v", got, tc.aksAnnotation)
				}
			}
			scc := false
			for _, r := range findAll[*rbacv1.Role](objs) {
				for _, rule := range r.Rules {
					if slices.Contains(rule.APIGroups, "security.openshift.io") {
						scc = true
						if !slices.Equal(rule.ResourceNames, []string{"privileged"}) || !slices.Equal(rule.Verbs, []string{"use"}) {
							t.Errorf("SCC rule %+v, want use on privileged only", rule)
						}
					}
				}
			}
			if scc != tc.scc {
				t.Errorf("SCC grant rendered: %v, want %v", scc, tc.scc)
			}
			if tc.scc {
				for _, d := range findAll[*appsv1.Deployment](objs) {
					if sc := d.Spec.Template.Spec.SecurityContext; sc == nil || sc.RunAsUser != nil || sc.RunAsGroup != nil {
						t.Errorf("%s: pod securityContext %+v, want no user or group on OpenShift", d.Name, sc)
					}
				}
			}
			if got := len(findAll[*corev1.ResourceQuota](objs)) > 0; got != tc.quota {
				t.Errorf("priority class quota rendered: %v, want %v", got, tc.quota)
			}
		})
	}
	// An explicit runtime class wins over the profile's.
	ds := one[*appsv1.DaemonSet](t, platformRelease(t, "gke", "agent: {runtimeClassName: nvidia, nvmlLibrary: /usr/lib/libnvidia-ml.so.1}"))
	if got := ptrString(ds.Spec.Template.Spec.RuntimeClassName); got != "nvidia" {
		t.Errorf("gke with agent.runtimeClassName=nvidia: %q", got)
	}
	if got, _ := containerArg(ds.Spec.Template.Spec.Containers[0], "--nvml-library"); got != "/usr/lib/libnvidia-ml.so.1" {
		t.Errorf("gke with agent.nvmlLibrary set: --nvml-library=%q", got)
	}
}

// TestWebhookHostNetwork: webhook.hostNetwork puts the serving pods, not
// the controller, on the node's network and its own ports.
func TestWebhookHostNetwork(t *testing.T) {
	objs := platformRelease(t, "eks", "webhook: {hostNetwork: true, hostNetworkPorts: {https: 10270}}")
	served := false
	for _, d := range findAll[*appsv1.Deployment](objs) {
		spec := d.Spec.Template.Spec
		ports := map[string]int32{}
		for _, p := range spec.Containers[0].Ports {
			ports[p.Name] = p.ContainerPort
		}
		if d.Name == fullname+"-controller" {
			if spec.HostNetwork {
				t.Errorf("the controller is on the host network")
			}
			continue
		}
		served = true
		if !spec.HostNetwork || spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
			t.Errorf("%s: hostNetwork %v, dnsPolicy %q", d.Name, spec.HostNetwork, spec.DNSPolicy)
		}
		if ports["https"] != 10270 || ports["metrics"] != 10261 || ports["probes"] != 10262 {
			t.Errorf("%s: ports %v", d.Name, ports)
		}
		if got, _ := containerArg(spec.Containers[0], "--port"); got != "10270" {
			t.Errorf("%s: --port=%s", d.Name, got)
		}
	}
	if !served {
		t.Fatal("no serving Deployment")
	}
	svc := named[*corev1.Service](t, objs, fullname+"-webhook")
	if svc.Spec.Ports[0].TargetPort.StrVal != "https" {
		t.Errorf("the Service targets %v, want the named port https", svc.Spec.Ports[0].TargetPort)
	}
}

func ptrString(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// valuePathRE is a dotted chart value path, as docs name them.
var valuePathRE = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9]*(\.[a-zA-Z][a-zA-Z0-9]*)*$`)

// lookupValue says whether path names a value in vals.
func lookupValue(vals map[string]any, path string) bool {
	var cur any = vals
	for _, k := range strings.Split(path, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return false
		}
		if cur, ok = m[k]; !ok {
			return false
		}
	}
	return true
}

// TestPlatformsPageNamesRealValues: every value docs/platforms.md names in
// its marked section, and every dotted value path it names anywhere
// (`agent.nvmlLibrary`, `--set webhook.hostNetwork=true`), is in values.yaml.
func TestPlatformsPageNamesRealValues(t *testing.T) {
	page, err := os.ReadFile(filepath.Join("..", "docs", "platforms.md"))
	if err != nil {
		t.Fatal(err)
	}
	vals, err := chartutil.ReadValuesFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(page)
	start := strings.Index(text, "<!-- chart-values")
	end := strings.Index(text, "<!-- /chart-values -->")
	if start < 0 || end < start {
		t.Fatal("docs/platforms.md lacks its <!-- chart-values --> section")
	}
	ticks := regexp.MustCompile("`([^`]+)`")
	section := 0
	for _, m := range ticks.FindAllStringSubmatch(text[start:end], -1) {
		section++
		if !valuePathRE.MatchString(m[1]) || !lookupValue(vals, m[1]) {
			t.Errorf("the chart-values section names %q, which is not a value in values.yaml", m[1])
		}
	}
	if section < 5 {
		t.Errorf("the chart-values section names %d values, want them all", section)
	}
	for _, m := range ticks.FindAllStringSubmatch(text, -1) {
		for _, f := range strings.Fields(m[1]) {
			f, _, _ = strings.Cut(f, "=")
			f = strings.TrimSuffix(f, ":")
			top, _, dotted := strings.Cut(f, ".")
			if _, known := vals[top]; !known || !dotted || !valuePathRE.MatchString(f) {
				continue
			}
			if !lookupValue(vals, f) {
				t.Errorf("docs/platforms.md names %q, which is not a value in values.yaml", f)
			}
		}
	}
}

// TestWarnFailsOpen: in warn and audit mode both pod webhooks fail open on
// every Kubernetes version, backstop or not; in enforce mode Ignore still
// needs the backstop.
func TestWarnFailsOpen(t *testing.T) {
	c := loadChart(t)
	for _, mode := range []string{"warn", "audit", "enforce"} {
		for _, fp := range []string{"Fail", "Ignore"} {
			// No backstop: as on Kubernetes before 1.36.
			v := fmt.Sprintf("policy: {mode: %s}\nbackstop: {enabled: false}\nwebhook: {failurePolicy: %s}\n", mode, fp)
			r, err := render(t, c, parseValues(t, v))
			if mode == "enforce" && fp == "Ignore" {
				if err == nil || !strings.Contains(err.Error(), "needs the CEL backstop") {
					t.Errorf("enforce, Ignore without the backstop: err %v, want a refusal", err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("%s, %s: %v", mode, fp, err)
			}
			objs := decodeAll(t, docs(r, false))
			want := admissionv1.Ignore
			if mode == "enforce" {
				want = admissionv1.Fail
			}
			m := one[*admissionv1.MutatingWebhookConfiguration](t, objs)
			vwc := one[*admissionv1.ValidatingWebhookConfiguration](t, objs)
			if got := *m.Webhooks[0].FailurePolicy; got != admissionv1.Ignore {
				t.Errorf("%s, %s: mutating webhook %s", mode, fp, got)
			}
			if got := *vwc.Webhooks[0].FailurePolicy; got != want {
				t.Errorf("%s, %s: pods' validating webhook %s, want %s", mode, fp, got, want)
			}
		}
	}
}
