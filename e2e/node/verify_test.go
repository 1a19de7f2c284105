//go:build e2e

package node

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"

	"github.com/gpuguard/gpuguard/e2e/framework"
)

// verifyDeadline is how soon the verifier must find a leak: the agent looks
// every two seconds here (ten by default).
const verifyDeadline = 30 * time.Second

// envLeak is a pod without a GPU limit whose image's ENV asks for every GPU.
func envLeak() *corev1.Pod { return probePod("verify-env-leak") }

// cdiLeak is a pod without a GPU limit that asks for every GPU through a CDI
// annotation.
func cdiLeak() *corev1.Pod {
	return withAnnotation(probePod("verify-cdi-leak"), cdiAllAnnotation, cdiAll)
}

// mountLeak is a pod without a GPU limit that forges a volume-mount device
// list entry for every GPU: /dev/null mounted under the device-list root.
func mountLeak() *corev1.Pod { return withDeviceListMount(probePod("verify-mount-leak"), "all") }

// withDeviceListMount adds to p's first container a /dev/null mount asking
// the runtime for device.
func withDeviceListMount(p *corev1.Pod, device string) *corev1.Pod {
	charDev := corev1.HostPathCharDev
	p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "device-list", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/dev/null", Type: &charDev}}})
	c := &p.Spec.Containers[0]
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "device-list", MountPath: "/var/run/nvidia-container-devices/" + device})
	return p
}

// testVerifierFinds runs a leaking pod in ns, where admission does not stop
// it, beside a GPU pod (made by gpu) that keeps to its allocation. The
// verifier must find the leaking pod within verifyDeadline, naming every GPU
// it reaches, with an Event on the pod; the GPU pod must produce no finding.
func testVerifierFinds(ns string, leak func() *corev1.Pod, gpu func(prefix string) *corev1.Pod) func(t *testing.T) {
	return func(t *testing.T) {
		ctx := context.Background()
		leaking := startHeld(t, ns, leak())
		own := startHeld(t, tenantNS, gpu("verify-own"))
		series := findingSeries(leaking)
		err := framework.Poll(ctx, verifyDeadline, func() (bool, error) {
			m, err := s.node.AgentMetrics(ctx)
			return err == nil && m[series] == float64(len(s.node.GPUs)), nil
		})
		if err != nil {
			m, _ := s.node.AgentMetrics(ctx)
			t.Fatalf("the verifier did not find %s/%s reaching all %d GPUs within %v: %s = %v\n%s", ns, leaking.Name,
				len(s.node.GPUs), verifyDeadline, series, m[series], s.node.AgentLogTail())
		}
		waitPasses(t, 2) // both pods ran through at least one whole pass
		m, err := s.node.AgentMetrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if v, ok := m[findingSeries(own)]; ok {
			t.Errorf("a GPU pod using its own allocation was reported: %v", v)
		}
		log := s.node.AgentLog()
		for _, g := range s.node.GPUs {
			if !strings.Contains(log, `"pod":"`+leaking.Name+`"`) || !strings.Contains(log, `"gpu":"`+g.UUID+`"`) {
				t.Errorf("the agent's log names no finding of %s on %s", leaking.Name, g.UUID)
			}
		}
		expectFindingEvent(t, leaking)
		expectClusterReport(t, leaking, len(s.node.GPUs))
	}
}

// expectClusterReport waits until the node's ClusterReport holds n results
// for the pod.
func expectClusterReport(t *testing.T, p *corev1.Pod, n int) {
	t.Helper()
	ctx := context.Background()
	dyn, err := dynamic.NewForConfig(s.cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	reports := dyn.Resource(schema.GroupVersionResource{Group: "openreports.io", Version: "v1alpha1", Resource: "clusterreports"})
	got := 0
	err = framework.Poll(ctx, verifyDeadline, func() (bool, error) {
		r, err := reports.Get(ctx, "gpuguard-node-"+s.node.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		results, _, _ := unstructured.NestedSlice(r.Object, "results")
		got = 0
		for _, res := range results {
			subjects, _, _ := unstructured.NestedSlice(res.(map[string]any), "resources")
			if len(subjects) == 1 && subjects[0].(map[string]any)["name"] == p.Name {
				got++
			}
		}
		return got == n, nil
	})
	if err != nil {
		t.Errorf("the node's ClusterReport holds %d results for %s, want %d", got, p.Name, n)
	}
}

// testVerifierQuiet: GPU pods keeping to their allocation, one GPU and two,
// produce no finding over two whole passes of the verifier.
func testVerifierQuiet(t *testing.T) {
	ctx := context.Background()
	two := gpuPod("verify-two")
	q := resource.MustParse("2")
	two.Spec.Containers[0].Resources.Limits[gpuResource] = q
	two.Spec.Containers[0].Resources.Requests[gpuResource] = q
	pods := []*corev1.Pod{startHeld(t, tenantNS, gpuPod("verify-one")), startHeld(t, tenantNS, two)}
	waitPasses(t, 2)
	m, err := s.node.AgentMetrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		if v, ok := m[findingSeries(p)]; ok {
			t.Errorf("%s, using its own allocation, was reported reaching %v GPUs it was not allocated", p.Name, v)
		}
	}
	if m[`gpuguard_agent_verify_containers`] < 2 {
		t.Errorf("the verifier looked at %v containers, want at least the 2 GPU pods", m[`gpuguard_agent_verify_containers`])
	}
}

// sharedResource is what the agent serves time-sliced GPUs as.
const sharedResource = gpuResource + ".shared"

// sharePod is a probe pod requesting n time-sliced GPU shares.
func sharePod(prefix string, n int) *corev1.Pod {
	p := probePod(prefix)
	q := *resource.NewQuantity(int64(n), resource.DecimalSI)
	p.Spec.Containers[0].Resources = corev1.ResourceRequirements{
		Limits: corev1.ResourceList{sharedResource: q}, Requests: corev1.ResourceList{sharedResource: q}}
	return p
}

func oneShare(prefix string) *corev1.Pod { return sharePod(prefix, 1) }

// sharedGPUs are the container paths of the GPUs whose shares the kubelet
// allocated to the pod's container.
func sharedGPUs(t *testing.T, p *corev1.Pod) []string {
	t.Helper()
	ids, err := s.node.AllocatedDevices(string(p.UID), p.Spec.Containers[0].Name, sharedResource)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, id := range ids {
		g, ok := s.node.GPUByID(id)
		if !ok {
			t.Fatalf("allocated share %q is of none of the node's GPUs", id)
		}
		if !slices.Contains(out, g.Container) {
			out = append(out, g.Container)
		}
	}
	slices.Sort(out)
	return out
}

// testTimeSlicedShares: on a node serving two shares of each GPU, a pod with
// one share and a pod with a share of every GPU run together, so they share
// the first pod's GPU. Admission treats the shares as GPUs (no void), a
// container sees exactly the GPUs of its shares, and over two whole passes
// the verifier reports none of them.
func testTimeSlicedShares(t *testing.T) {
	ctx := context.Background()
	one := startHeld(t, tenantNS, sharePod("share-one", 1))
	every := startHeld(t, tenantNS, sharePod("share-every", len(s.node.GPUs)))
	oneGPUs, everyGPUs := sharedGPUs(t, one), sharedGPUs(t, every)
	if len(oneGPUs) != 1 || len(everyGPUs) != len(s.node.GPUs) {
		t.Fatalf("shares of %v and %v GPUs; want 1 and, spread over the node, all %d", oneGPUs, everyGPUs, len(s.node.GPUs))
	}
	if !slices.Contains(everyGPUs, oneGPUs[0]) {
		t.Fatalf("%s's GPU %s is not among %s's %v", one.Name, oneGPUs[0], every.Name, everyGPUs)
	}
	report, p := probe(t, tenantNS, sharePod("share-probe", 1))
	if v := lastEnv(p.Spec.Containers[0], "NVIDIA_VISIBLE_DEVICES"); v == "void" {
		t.Errorf("admission gave a container with a %s limit NVIDIA_VISIBLE_DEVICES=void", sharedResource)
	}
	expectGPUs(t, report, sharedGPUs(t, p))

	waitPasses(t, 2)
	m, err := s.node.AgentMetrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []*corev1.Pod{one, every} {
		if v, ok := m[findingSeries(p)]; ok {
			t.Errorf("%s, using its own shares, was reported reaching %v GPUs it was not allocated", p.Name, v)
		}
	}
}

// testVerifierEnforceStops: in enforce mode the leaking container is
// stopped and its pod deleted within a pass, although the tenant did what
// held back an eviction: a PodDisruptionBudget allowing no disruption, a
// year's grace period, and a process that ignores SIGTERM.
func testVerifierEnforceStops(t *testing.T) {
	ctx := context.Background()
	leaking := envLeak()
	year := int64(365 * 24 * 3600)
	leaking.Labels = map[string]string{"app": "verify-env-leak"}
	leaking.Spec.TerminationGracePeriodSeconds = &year
	leaking.Spec.Containers[0].Env = append(leaking.Spec.Containers[0].Env, corev1.EnvVar{Name: "PROBE_IGNORE_TERM", Value: "1"})
	none := intstr.FromInt32(0)
	pdbs := s.cp.Client.PolicyV1().PodDisruptionBudgets(exemptNS)
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "verify-env-leak"},
		Spec: policyv1.PodDisruptionBudgetSpec{MaxUnavailable: &none, Selector: &metav1.LabelSelector{MatchLabels: leaking.Labels}}}
	if _, err := pdbs.Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pdbs.Delete(ctx, pdb.Name, metav1.DeleteOptions{}) })
	// Not waited for as running: on a container start event the verifier may
	// stop it before a poll sees it run.
	pods := s.cp.Client.CoreV1().Pods(exemptNS)
	if _, err := pods.Create(ctx, leaking, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.node.DeletePod(ctx, exemptNS, leaking.Name) })
	err := framework.Poll(ctx, verifyDeadline, func() (bool, error) {
		_, err := pods.Get(ctx, leaking.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("%s is still there after %v: the verifier did not stop it past its budget and grace period\n%s",
			leaking.Name, verifyDeadline, s.node.AgentLogTail())
	}
	const stopped = `gpuguard_agent_verify_evictions_total{result="stopped"}`
	err = framework.Poll(ctx, verifyDeadline, func() (bool, error) {
		m, err := s.node.AgentMetrics(ctx)
		return err == nil && m[stopped] >= 1, nil
	})
	if err != nil {
		t.Errorf("the stop was not counted")
	}
}

func startHeld(t *testing.T, ns string, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	running, err := s.node.StartHeldProbe(ctx, ns, p)
	t.Cleanup(func() { _ = s.node.DeletePod(ctx, ns, p.Name) })
	if err != nil {
		t.Fatal(err)
	}
	return running
}

func findingSeries(p *corev1.Pod) string {
	return fmt.Sprintf(`gpuguard_agent_unallocated_gpu_access{container="%s",namespace="%s",pod="%s"}`,
		p.Spec.Containers[0].Name, p.Namespace, p.Name)
}

// waitPasses waits until the verifier has completed n more passes.
func waitPasses(t *testing.T, n float64) {
	t.Helper()
	ctx := context.Background()
	const passes = `gpuguard_agent_verify_passes_total{result="ok"}`
	m, err := s.node.AgentMetrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start := m[passes]
	err = framework.Poll(ctx, verifyDeadline, func() (bool, error) {
		m, err := s.node.AgentMetrics(ctx)
		return err == nil && m[passes] >= start+n, nil
	})
	if err != nil {
		t.Fatalf("the verifier completed no %v passes: %v\n%s", n, err, s.node.AgentLogTail())
	}
}

func expectFindingEvent(t *testing.T, p *corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	err := framework.Poll(ctx, verifyDeadline, func() (bool, error) {
		evs, err := s.cp.Client.CoreV1().Events(p.Namespace).List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.name=" + p.Name + ",reason=UnallocatedGPUAccess"})
		return err == nil && len(evs.Items) > 0, nil
	})
	if err != nil {
		t.Errorf("no UnallocatedGPUAccess Event on %s/%s: %v", p.Namespace, p.Name, err)
	}
}
