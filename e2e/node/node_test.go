//go:build e2e

package node

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/gpuguard/gpuguard/e2e/framework"
	"github.com/gpuguard/gpuguard/e2e/framework/controlplane"
	"github.com/gpuguard/gpuguard/e2e/framework/kubenode"
)

// The node configurations of the scenarios. "Typical" is a GPU cluster as
// commonly set up: the NVIDIA runtime is containerd's default handler and
// the toolkit keeps its defaults.
var (
	typical = kubenode.NodeProfile{Strategy: "envvar"}
	// typicalEnforcing is the typical node with the agent's verifier stopping
	// leaking containers.
	typicalEnforcing = kubenode.NodeProfile{Strategy: "envvar", Verify: "enforce"}
	hardenedMount    = kubenode.NodeProfile{Hardened: true, Strategy: "volume-mounts"}
	hardenedCDIAn    = kubenode.NodeProfile{Hardened: true, Strategy: "cdi-annotations"}
	hardenedCDI      = kubenode.NodeProfile{Hardened: true, Strategy: "cdi-cri"}
	passthrough      = kubenode.NodeProfile{Hardened: true, Strategy: "cdi-cri", PodAnnotations: []string{"cdi.k8s.io/*"}}
	ownCDISpec       = kubenode.NodeProfile{Hardened: true, Strategy: "cdi-cri", OwnCDISpec: true}
	timeSliced       = kubenode.NodeProfile{Hardened: true, Strategy: "volume-mounts", SharedReplicas: 2}
	// enforced is the typical node with the agent's node enforcer, and
	// enforcedPassthrough the same passing cdi.k8s.io pod annotations on.
	enforced            = kubenode.NodeProfile{Strategy: "envvar", Enforce: true}
	enforcedPassthrough = kubenode.NodeProfile{Strategy: "envvar", Enforce: true, PodAnnotations: []string{"cdi.k8s.io/*"}}
	enforcedRequired    = kubenode.NodeProfile{Strategy: "envvar", Enforce: true, RequireEnforcer: true}
	// enforcedMount is a node whose runtime honours device-list mounts, and
	// enforcedTimeSliced the same with time-sliced GPUs, with the enforcer.
	enforcedMount      = kubenode.NodeProfile{Hardened: true, Strategy: "volume-mounts", Enforce: true}
	enforcedTimeSliced = kubenode.NodeProfile{Hardened: true, Strategy: "volume-mounts", SharedReplicas: 2, Enforce: true}
	// enforcedMIG is the typical node with MIG devices, with the enforcer.
	enforcedMIG = kubenode.NodeProfile{Strategy: "envvar", MIG: true, Enforce: true}
)

// defaultPolicy is the built-in policy but for host-network-ipc, which
// warns: the node runs no CNI, so every probe pod shares the node's
// network. The rule is proven through the API server by its fixtures (the
// control-plane suite), not here.
const defaultPolicy = `apiVersion: gpuguard.io/v1alpha1
kind: GPUGuardPolicy
spec:
  advisories:
    hostNetworkIPC: warn
`

// cdiAllAnnotation asks for every GPU through CDI.
const cdiAllAnnotation, cdiAll = "cdi.k8s.io/probe", kubenode.CDIKind + "=all"

// TestNode runs the scenarios in order: the node's configuration and
// gpuguard's installation carry from one to the next.
func TestNode(t *testing.T) {
	t.Run("node enforcer without admission", func(t *testing.T) {
		apply(t, enforced)
		t.Run("a CUDA-image pod without a GPU limit sees no GPU", testEnforcedNoGPU)
		t.Run("a pod without a GPU limit asking for every GPU by env sees none", testEnforcedNoGPUEnvAll)
		t.Run("a one-GPU pod asking for every GPU by env sees its own", testEnforcedEnvAll)
		t.Run("a one-GPU pod taking every GPU from a Secret sees its own", testEnforcedSecret)
		t.Run("a GPU init container asking for every GPU sees its own", testEnforcedInitContainer)
		t.Run("a pod bound to the node asking for what it does not advertise sees no GPU", testEnforcedUnhonoured)
		t.Run("a privileged container is refused", testEnforcedPrivilegedRefused)
		t.Run("protected variables in a pod without GPUs end with values that grant nothing", testEnforcedProtectedEnv)
		t.Run("the enforcer judges devices by number: a GPU's node under another path is refused", testEnforcedDeviceByNumber)
		t.Run("the enforcer judges devices by number: a cgroup rule for every GPU minor is refused", testEnforcedWildcardRule)
		t.Run("a hostPath leading through a link planted by another pod into /dev is refused; a plain host directory and a GPU pod start", testEnforcedPlantedLink)
		t.Run("a burst of creations beyond the kubelet's PodResources rate is judged, none refused", testEnforcedBurst)
		t.Run("with the enforcer down a container is created as its pod says, and judged at its next start", testEnforcerDownFailsOpen)
		apply(t, enforcedRequired)
		t.Run("required by containerd, with the enforcer down a container is refused until it is back", testEnforcerRequired)
		t.Run("covered, a GPU container restarting while the agent restarts is refused, then sees its own GPU", testRequiredAgentRestart)
		t.Run("covered, a GPU container restarting after the agent is SIGKILLed, its Lease fresh, is refused, then sees its own GPU", testRequiredAgentKilled)
		t.Run("covered, a GPU container restarting after containerd restarts, the enforcer not yet back, is refused, then sees its own GPU", testRequiredContainerdRestart)
		t.Run("a later NRI plugin's GPU node, CDI device and device variable get the container refused; a one-GPU pod beside it keeps its own", testEnforcedLaterPlugin)
		apply(t, enforcedPassthrough)
		t.Run("a one-GPU pod asking for every GPU by CDI annotation sees its own", testEnforcedCDIAnnotation)
		apply(t, enforcedMount)
		t.Run("a one-GPU pod asking for every GPU by device-list mount sees its own", testEnforcedDeviceListMount)
		apply(t, enforcedTimeSliced)
		t.Run("time-slicing: pods sharing GPUs keep their shares' GPUs, a forged mount asks for more in vain", testEnforcedTimeSliced)
		apply(t, enforcedMIG)
		t.Run("MIG: a MIG device's pod keeps exactly its device, env asking for every GPU or not", testEnforcedMIG)
	})
	t.Run("typical node", func(t *testing.T) {
		apply(t, typical)
		t.Run("without gpuguard a pod without GPUs sees every GPU", testLeak)
		t.Run("without gpuguard a non-root pod mounting / read-only reaches the runtime's socket", testHostRootReachesRuntime)
		t.Run("without gpuguard a hostPID root sidecar reaches the runtime's socket through a read-only / exporter", testHostPIDSidecarReachesRuntime)
		t.Run("without gpuguard a pod bound to the node asking for a GPU resource it does not advertise sees every GPU", testUnhonouredRequestLeaks)
		t.Run("the verifier finds a pod created while admission was absent", testVerifierFinds(tenantNS, envLeak, gpuPod))
		installGPUGuard(t)
		t.Run("the verifier finds a pod in a namespace admission does not guard", testVerifierFinds(exemptNS, envLeak, gpuPod))
		t.Run("with gpuguard the same pod sees none", testLeakClosed)
		t.Run("with gpuguard NVIDIA_VISIBLE_DEVICES=all is denied", testEnvAllDenied)
		t.Run("with gpuguard the pod asking for what the node does not advertise gets void and sees none", testUnhonouredRequestClosed)
		t.Run("with gpuguard the same read-only / gets pinned groups and the socket refuses it", testHostRootPinned)
		t.Run("with gpuguard the hostPID root sidecar is denied", testHostPIDSidecarDenied)
		t.Run("the kubelet's status reports never reach the webhook", testStatusReportsNotSent)
		t.Run("envvar: a GPU pod sees its device only", testAllocation)
		t.Run("envvar: the verifier finds nothing on GPU pods using their own GPUs", testVerifierQuiet)
		t.Run("widening a GPU pod's allocation is denied", testWideningDenied)
		t.Run("hardening report says not hardened", testReportNotHardened)
		apply(t, typicalEnforcing)
		t.Run("the verifier in enforce mode stops a leaking pod despite its PodDisruptionBudget and grace period", testVerifierEnforceStops)
	})
	t.Run("hardened node", func(t *testing.T) {
		apply(t, hardenedMount)
		t.Run("volume-mounts: a GPU pod sees its device only", testVolumeMountAllocation)
		t.Run("volume-mounts: the verifier finds nothing on GPU pods using their own GPUs", testVerifierQuiet)
		t.Run("volume-mounts: the verifier finds a forged device-list mount admission does not guard", testVerifierFinds(exemptNS, mountLeak, gpuPod))
		t.Run("env alone grants nothing, even without admission", testHardenedEnvIgnored)
		t.Run("a CDI pod annotation grants nothing without passthrough", testAnnotationNotPassed)
		t.Run("hardening report says hardened", testReportHardened)
		apply(t, hardenedCDIAn)
		t.Run("cdi-annotations: a GPU pod sees its device only", testAllocation)
		apply(t, hardenedCDI)
		t.Run("cdi-cri: a GPU pod sees its device only", testAllocation)
		t.Run("cdi-cri: the verifier finds nothing on GPU pods using their own GPUs", testVerifierQuiet)
		t.Run("after a kubelet restart the agent registers again", testKubeletRestart)
		apply(t, ownCDISpec)
		t.Run("cdi-cri with the agent's own CDI spec: a GPU pod sees its device only", testOwnCDISpecAllocation)
	})
	t.Run("node passing cdi.k8s.io pod annotations to the runtime", func(t *testing.T) {
		apply(t, passthrough)
		t.Run("without gpuguard a CDI pod annotation grants every GPU", testAnnotationPassed)
		t.Run("with gpuguard it is denied", testAnnotationDenied)
		t.Run("the verifier finds a CDI annotation pod admission does not guard", testVerifierFinds(exemptNS, cdiLeak, gpuPod))
		t.Run("hardening report flags the passthrough", testReportPassthrough)
	})
	t.Run("hardened node with time-sliced GPUs", func(t *testing.T) {
		apply(t, timeSliced)
		t.Run("time-slicing: pods sharing GPUs see their shares' GPUs only, and the verifier finds nothing", testTimeSlicedShares)
		t.Run("time-slicing: the verifier finds a forged device-list mount admission does not guard", testVerifierFinds(exemptNS, mountLeak, oneShare))
	})
}

func installGPUGuard(t *testing.T) {
	if os.Getenv(withoutGPUGuardEnv) == "1" {
		t.Logf("%s=1: gpuguard is not installed, the scenarios that need it must fail", withoutGPUGuardEnv)
		return
	}
	ctx := context.Background()
	in, err := controlplane.Install(ctx, s.cp, s.root, releaseNS, defaultPolicy, exemptNS)
	if err != nil {
		t.Fatalf("installing gpuguard: %v", err)
	}
	s.in = in
	if err := controlplane.WaitEnforcing(ctx, s.cp.Client, tenantNS, time.Minute); err != nil {
		t.Fatalf("gpuguard not enforcing: %v\n%s", err, framework.Tail(in.Webhook.Log))
	}
}

// testLeak is the baseline: the image's NVIDIA_VISIBLE_DEVICES=all reaches
// the runtime, which gives the container every GPU of the node.
func testLeak(t *testing.T) {
	report, _ := probe(t, tenantNS, probePod("no-gpu"))
	expectGPUs(t, report, allGPUs())
}

func testLeakClosed(t *testing.T) {
	expectVoidAndNoGPU(t, probePod("no-gpu"))
}

// expectVoidAndNoGPU runs the probe pod p: stored with the void gpuguard
// injects, it must see no GPU.
func expectVoidAndNoGPU(t *testing.T, p *corev1.Pod) {
	t.Helper()
	report, pod := probe(t, tenantNS, p)
	if v := lastEnv(pod.Spec.Containers[0], "NVIDIA_VISIBLE_DEVICES"); v != "void" {
		t.Errorf("stored NVIDIA_VISIBLE_DEVICES is %q, want void (injected by gpuguard)", v)
	}
	expectGPUs(t, report, nil)
}

func testEnvAllDenied(t *testing.T) {
	expectDenied(t, create(t, tenantNS, withEnv(probePod("env-all"), "NVIDIA_VISIBLE_DEVICES", "all")), "device-env")
}

func testAllocation(t *testing.T) {
	report, pod := probe(t, tenantNS, gpuPod("one-gpu"))
	expectAllocatedOnly(t, report, pod)
}

// testOwnCDISpecAllocation: the agent names devices of its own spec
// (gpuguard.io/gpu), which nothing else on the node defines, so the pod's
// device can only have come through that spec.
func testOwnCDISpecAllocation(t *testing.T) {
	specs, err := filepath.Glob(filepath.Join(s.node.CDIDir(), "*"))
	if err != nil {
		t.Fatal(err)
	}
	var own []string
	for _, f := range specs {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var spec struct{ Kind string }
		if err := yaml.Unmarshal(data, &spec); err != nil { // JSON or YAML
			t.Fatalf("%s: %v", f, err)
		}
		if spec.Kind == "gpuguard.io/gpu" {
			own = append(own, f)
		}
	}
	if len(own) != 1 {
		t.Fatalf("want the agent's own spec (kind gpuguard.io/gpu) in %s, found %v among %v", s.node.CDIDir(), own, specs)
	}
	testAllocation(t)
}

func testVolumeMountAllocation(t *testing.T) {
	report, pod := probe(t, tenantNS, gpuPod("one-gpu"))
	g := expectAllocatedOnly(t, report, pod)
	want := path.Join("/var/run/nvidia-container-devices", g.UUID)
	if len(report.DeviceListFiles) != 1 || report.DeviceListFiles[0] != want {
		t.Errorf("device list entries %v, want [%s]", report.DeviceListFiles, want)
	}
}

// testWideningDenied: a GPU pod may not add devices through its env, an
// envFrom prefix, or a forged device-list mount.
func testWideningDenied(t *testing.T) {
	ctx := context.Background()
	expectDenied(t, create(t, tenantNS, withEnv(gpuPod("widen-env"), "NVIDIA_VISIBLE_DEVICES", "all")), "device-env")

	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "gpus"}, Data: map[string]string{"VISIBLE_DEVICES": "all"}}
	if _, err := s.cp.Client.CoreV1().ConfigMaps(tenantNS).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	viaPrefix := gpuPod("widen-envfrom")
	viaPrefix.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{Prefix: "NVIDIA_",
		ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: cm.Name}}}}
	expectDenied(t, create(t, tenantNS, viaPrefix), "envfrom-prefix")

	forged := gpuPod("widen-mount")
	file := corev1.HostPathFile
	forged.Spec.Volumes = []corev1.Volume{{Name: "all", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/dev/null", Type: &file}}}}
	forged.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "all", MountPath: "/var/run/nvidia-container-devices/all"}}
	expectDenied(t, create(t, tenantNS, forged), "device-list-mount")
}

// testHardenedEnvIgnored: with the hardened toolkit the variable is not a
// way to get a GPU, so even a pod admission never saw gets none.
func testHardenedEnvIgnored(t *testing.T) {
	report, _ := probe(t, exemptNS, withEnv(probePod("exempt-env-all"), "NVIDIA_VISIBLE_DEVICES", "all"))
	expectGPUs(t, report, nil)
}

// testAnnotationNotPassed: the kubelet does not copy pod annotations to the
// container, so on a default containerd they reach neither CDI nor the
// runtime.
func testAnnotationNotPassed(t *testing.T) {
	report, _ := probe(t, exemptNS, withAnnotation(probePod("exempt-cdi"), cdiAllAnnotation, cdiAll))
	expectGPUs(t, report, nil)
}

func testAnnotationPassed(t *testing.T) {
	report, _ := probe(t, exemptNS, withAnnotation(probePod("exempt-cdi"), cdiAllAnnotation, cdiAll))
	expectGPUs(t, report, allGPUs())
}

func testAnnotationDenied(t *testing.T) {
	expectDenied(t, create(t, tenantNS, withAnnotation(probePod("cdi-annotation"), cdiAllAnnotation, cdiAll)), "device-annotation")
}

func testKubeletRestart(t *testing.T) {
	if err := s.node.RestartKubelet(context.Background()); err != nil {
		t.Fatalf("%v\n%s", err, s.node.LogTails())
	}
	testAllocation(t)
}

func testReportNotHardened(t *testing.T) {
	expectReport(t, 0, map[string]string{"envvar_when_unprivileged_rejected": "fail", "nvidia_not_default_runtime": "fail"})
}

func testReportHardened(t *testing.T) {
	expectReport(t, 1, map[string]string{"envvar_when_unprivileged_rejected": "pass", "volume_mounts_accepted": "pass",
		"runtime_mode": "pass", "toolkit_version": "pass", "cdi_pod_annotations_not_passed": "pass"})
}

func testReportPassthrough(t *testing.T) {
	expectReport(t, 0, map[string]string{"envvar_when_unprivileged_rejected": "pass", "cdi_pod_annotations_not_passed": "fail"})
}

// expectReport checks the agent's hardening report as exported.
func expectReport(t *testing.T, hardened float64, checks map[string]string) {
	t.Helper()
	m, err := s.node.AgentMetrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got := m["gpuguard_agent_node_hardened"]; got != hardened {
		t.Errorf("gpuguard_agent_node_hardened = %v, want %v", got, hardened)
	}
	for check, status := range checks {
		key := `gpuguard_agent_node_hardening_check{check="` + check + `",status="` + status + `"}`
		if m[key] != 1 {
			t.Errorf("%s is not 1", key)
		}
	}
}

// testStatusReportsNotSent runs a pod to completion, so that the kubelet
// reports its status several times, and checks that the webhook decided no
// UPDATE meanwhile: the chart sends pods/status only when annotations change.
// A status update that adds a device annotation, sent next, must be denied
// and counted, so a flat count is the filter at work and not a dead metric.
func testStatusReportsNotSent(t *testing.T) {
	ctx := context.Background()
	if s.in == nil {
		t.Fatal("gpuguard is not installed")
	}
	before := updateDecisions(t)
	_, done := probe(t, tenantNS, probePod("status-reports"))
	if done.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("the kubelet reported phase %s, want Succeeded", done.Status.Phase)
	}
	if after := updateDecisions(t); after != before {
		t.Errorf("the webhook decided %v UPDATE requests while the kubelet reported a pod's status, want none", after-before)
	}
	pod := s.node.ProbePod(fmt.Sprintf("status-annotated-%d", podSeq.Add(1)))
	created, err := s.cp.Client.CoreV1().Pods(tenantNS).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.node.DeletePod(ctx, tenantNS, pod.Name) })
	before = updateDecisions(t)
	// A merge patch carries no resourceVersion, so the kubelet's own status
	// reports on this pod cannot make it conflict.
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{cdiAllAnnotation: cdiAll}}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.cp.Client.CoreV1().Pods(tenantNS).Patch(ctx, created.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	expectDenied(t, err, "device-annotation")
	if after := updateDecisions(t); after <= before {
		t.Errorf("a status update that adds a device annotation was not counted (%v before, %v after)", before, after)
	}
}

// updateDecisions sums the webhook's decisions on UPDATE requests.
func updateDecisions(t *testing.T) float64 {
	t.Helper()
	n, err := s.in.Webhook.Decisions(context.Background(), `operation="UPDATE"`)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
