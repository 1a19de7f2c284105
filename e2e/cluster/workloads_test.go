//go:build e2e

package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/gpuguard/gpuguard/e2e/framework"
	"github.com/gpuguard/gpuguard/e2e/framework/controlplane"
	"github.com/gpuguard/gpuguard/e2e/framework/kubenode"
)

// Runs after the walkthrough (files run in name order), on a cluster it left
// without gpuguard.
const (
	gpuReleaseNS = "gpuguard-system"
	tenantNS     = "team-a"
	// Node Feature Discovery's label for an NVIDIA PCI device, as a cluster
	// without the GPU Operator has: the chart's agent must find such nodes
	// too (GPU Feature Discovery's label is checked by the chart tests).
	gpuLabel = "feature.node.kubernetes.io/pci-10de.present"
)

// TestChartServesGPUs installs the whole chart, agent included, on a node
// made a GPU node (labelled as Node Feature Discovery would, with the
// NVIDIA runtime class), and runs pods the scheduler places: the agent's
// DaemonSet serves the node's GPUs through the kubelet, a pod with one GPU
// sees exactly the one the kubelet allocated, a CUDA-style pod without a
// GPU limit sees none, and one asking for every GPU is denied.
func TestChartServesGPUs(t *testing.T) {
	ctx := context.Background()
	makeGPUNode(t)
	if err := controlplane.EnsureNamespace(ctx, s.cp, tenantNS, nil); err != nil {
		t.Fatal(err)
	}
	// Without gpuguard, a pod without a GPU limit opens every GPU: the
	// checks below fail when gpuguard does nothing.
	waitUnguarded(t, tenantNS)
	leak := runPod(t, scheduledProbe("leak-before"), nil)
	if got := len(leak.GPUs()); got != len(s.node.GPUs) {
		t.Fatalf("before install, a CUDA-style pod without a GPU limit should see all %d GPUs, saw %v", len(s.node.GPUs), leak.GPUs())
	}
	// The same pod, still running when gpuguard is installed: admission never
	// sees it, the chart's node verifier must.
	running, err := s.node.StartHeldProbe(ctx, tenantNS, scheduledProbe("running-before"))
	t.Cleanup(func() { _ = s.node.DeletePod(ctx, tenantNS, "running-before") })
	if err != nil {
		t.Fatal(err)
	}

	installWithAgent(t)
	waitAllocatableGPUs(t, len(s.node.GPUs))

	t.Run("the verifier finds a pod that ran before install", func(t *testing.T) {
		err := framework.Poll(ctx, time.Minute, func() (bool, error) {
			evs, err := s.cp.Client.CoreV1().Events(tenantNS).List(ctx, metav1.ListOptions{
				FieldSelector: "involvedObject.name=" + running.Name + ",reason=UnallocatedGPUAccess"})
			if err != nil || len(evs.Items) == 0 {
				return false, nil
			}
			for _, g := range s.node.GPUs {
				if !strings.Contains(evs.Items[0].Message, g.UUID) {
					return false, fmt.Errorf("the Event names not every GPU: %s", evs.Items[0].Message)
				}
			}
			return true, nil
		})
		if err != nil {
			t.Fatalf("the chart's agent recorded no UnallocatedGPUAccess Event naming every GPU on %s: %v\n%s", running.Name, err, s.node.LogTails())
		}
	})

	t.Run("gpuguard audit finds the pod that ran before install", func(t *testing.T) {
		bin, err := framework.BuildGPUGuard(s.root, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		out, err := newShell(t).run(fmt.Sprintf("%s audit -n %s --policy-configmap %s/gpuguard-policy -o json 2>/dev/null", bin, tenantNS, gpuReleaseNS))
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Fatalf("audit: %v, want exit status 1 (something denied)\n%s", err, out)
		}
		var results []struct {
			Kind, Name string
			Violations []struct{ Rule string }
		}
		if err := json.Unmarshal([]byte(out), &results); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		found := slices.ContainsFunc(results, func(r struct {
			Kind, Name string
			Violations []struct{ Rule string }
		}) bool {
			return r.Kind == "Pod" && r.Name == running.Name && len(r.Violations) > 0 && r.Violations[0].Rule == "final-state"
		})
		if !found {
			t.Errorf("the audit does not name %s with final-state: %s", running.Name, out)
		}
	})
	t.Run("the background audit reports the pod that ran before install", func(t *testing.T) {
		expectReported(t, "reports", tenantNS, "gpuguard", running.Name, "final-state")
	})
	t.Run("the node's ClusterReport holds the verifier's finding", func(t *testing.T) {
		expectReported(t, "clusterreports", "", "gpuguard-node-"+nodeName, running.Name, "unallocated-gpu-access")
	})
	t.Run("one GPU", func(t *testing.T) {
		var pod *corev1.Pod
		report := runPod(t, withGPULimit(scheduledProbe("one-gpu"), 1), &pod)
		allocated, err := s.node.AllocatedDevices(string(pod.UID), "probe", "nvidia.com/gpu")
		if err != nil {
			t.Fatal(err)
		}
		if len(allocated) != 1 {
			t.Fatalf("the kubelet allocated %v, want one GPU", allocated)
		}
		gpu, ok := s.node.GPUByID(allocated[0])
		if !ok {
			t.Fatalf("the kubelet allocated %q, which is none of the node's GPUs", allocated[0])
		}
		if !slices.Equal(report.GPUs(), []string{gpu.Container}) {
			t.Fatalf("the pod saw %v, want only its allocated GPU %s", report.GPUs(), gpu.Container)
		}
	})
	t.Run("no GPU limit", func(t *testing.T) {
		report := runPod(t, scheduledProbe("no-limit"), nil)
		if len(report.GPUs()) != 0 || report.Env["NVIDIA_VISIBLE_DEVICES"] != "void" {
			t.Fatalf("a pod without a GPU limit saw %v with NVIDIA_VISIBLE_DEVICES=%q, want none and void",
				report.GPUs(), report.Env["NVIDIA_VISIBLE_DEVICES"])
		}
	})
	t.Run("every GPU by env", func(t *testing.T) {
		pod := scheduledProbe("all-by-env")
		pod.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}
		_, err := s.cp.Client.CoreV1().Pods(tenantNS).Create(ctx, pod, metav1.CreateOptions{})
		if rules, notDenial := framework.DeniedRules(err); notDenial != nil || !slices.Contains(rules, "device-env") {
			t.Fatalf("want a denial by rule device-env, got %v", err)
		}
	})
	t.Run("deleting the webhook configurations leaves the backstop in force", testBackstopOutlivesWebhookConfigurations)
}

// makeGPUNode labels the node as a GPU node and creates the NVIDIA runtime
// class, as the GPU Operator or a node image would; both go at cleanup.
func makeGPUNode(t *testing.T) {
	ctx := context.Background()
	rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "nvidia"}, Handler: "nvidia"}
	if _, err := s.cp.Client.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	labelNode(t, fmt.Sprintf(`{"metadata":{"labels":{%q:"true"}}}`, gpuLabel))
	t.Cleanup(func() {
		labelNode(t, fmt.Sprintf(`{"metadata":{"labels":{%q:null}}}`, gpuLabel))
		_ = s.cp.Client.NodeV1().RuntimeClasses().Delete(ctx, "nvidia", metav1.DeleteOptions{})
	})
}

func labelNode(t *testing.T, patch string) {
	_, err := s.cp.Client.CoreV1().Nodes().Patch(context.Background(), nodeName, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

// leastPrivilege is the agent's securityContext in the cluster suite.
const leastPrivilege = `{"runAsUser":0,"allowPrivilegeEscalation":false,"readOnlyRootFilesystem":true,"capabilities":{"drop":["ALL"],"add":["SYS_PTRACE"]}}`

// installWithAgent installs the chart with the values this node needs for
// the agent (its mock backend and config paths) and enforce (the chart's
// default is warn); everything else default.
func installWithAgent(t *testing.T) {
	args, err := json.Marshal(s.node.ChartAgentArgs())
	if err != nil {
		t.Fatal(err)
	}
	sh := newShell(t)
	// The least privilege docs/agent.md gives the device plugin and the
	// verifier: root without privilege, every capability dropped but
	// SYS_PTRACE (the verifier reads other containers' /proc/<pid>/root).
	install := fmt.Sprintf("helm install gpuguard oci://$REGISTRY/charts/gpuguard -n %s --create-namespace --wait --timeout 4m --set policy.mode=enforce"+
		" --set agent.deviceListStrategy=envvar --set agent.cdiSpec=toolkit --set agent.hostPaths.cdiSpecDir=%s"+
		" --set-json 'agent.extraArgs=%s' --set-json 'agent.securityContext=%s'", gpuReleaseNS, s.node.CDIDir(), args, leastPrivilege)
	if out, err := sh.run(install); err != nil {
		t.Fatalf("%s: %v\n%s\n%s", install, err, out, s.node.LogTails())
	}
	t.Cleanup(func() {
		if out, err := sh.run("helm uninstall gpuguard -n " + gpuReleaseNS + " --wait"); err != nil {
			t.Errorf("helm uninstall: %v\n%s", err, out)
		}
	})
}

func waitAllocatableGPUs(t *testing.T, want int) {
	ctx := context.Background()
	var got int64
	err := framework.Poll(ctx, 2*time.Minute, func() (bool, error) {
		node, err := s.cp.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		q := node.Status.Allocatable["nvidia.com/gpu"]
		got = q.Value()
		return got == int64(want), nil
	})
	if err != nil {
		t.Fatalf("the node offers %d nvidia.com/gpu, want %d from the chart's agent: %v\n%s", got, want, err, s.node.LogTails())
	}
}

// scheduledProbe is the node suite's probe pod, left to the scheduler and
// on the pod network.
func scheduledProbe(name string) *corev1.Pod {
	pod := s.node.ProbePod(name)
	pod.Spec.NodeName = ""
	pod.Spec.HostNetwork = false
	return pod
}

func withGPULimit(pod *corev1.Pod, n int64) *corev1.Pod {
	pod.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": *resource.NewQuantity(n, resource.DecimalSI)}
	return pod
}

// runPod runs the probe pod in the tenant namespace and returns its report;
// the pod as it ran goes to *ran when asked for. The pod is deleted after.
func runPod(t *testing.T, pod *corev1.Pod, ran **corev1.Pod) kubenode.ProbeReport {
	t.Helper()
	ctx := context.Background()
	report, done, err := s.node.RunProbe(ctx, tenantNS, pod)
	t.Cleanup(func() { _ = s.node.DeletePod(ctx, tenantNS, pod.Name) })
	if err != nil {
		t.Fatal(err)
	}
	if ran != nil {
		*ran = done
	}
	return report
}

// expectReported waits until an OpenReports report holds a result of rule
// about the pod.
func expectReported(t *testing.T, resource, ns, name, pod, rule string) {
	t.Helper()
	ctx := context.Background()
	dyn, err := dynamic.NewForConfig(s.cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	reports := dyn.Resource(schema.GroupVersionResource{Group: "openreports.io", Version: "v1alpha1", Resource: resource})
	var last string
	err = framework.Poll(ctx, 2*time.Minute, func() (bool, error) {
		r, err := reports.Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		results, _, _ := unstructured.NestedSlice(r.Object, "results")
		data, _ := json.Marshal(results)
		last = string(data)
		return strings.Contains(last, `"name":"`+pod+`"`) && strings.Contains(last, `"rule":"`+rule+`"`), nil
	})
	if err != nil {
		t.Fatalf("%s %s/%s holds no %s result about %s: %s", resource, ns, name, rule, pod, last)
	}
}
