//go:build e2e

package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpuguard/gpuguard/e2e/framework"
	"github.com/gpuguard/gpuguard/e2e/framework/kubenode"
	"github.com/gpuguard/gpuguard/internal/wellknown"
)

// The scenarios of the node enforcer run before gpuguard's webhook is
// installed, with no backstop either: what they show is the node's doing
// alone. With GPUGUARD_E2E_NODE_WITHOUT_GPUGUARD=1 the agent runs without
// the enforcer and every one of them fails.

// logEnforcerOnFailure logs the enforcer's lines of the agent's log when
// the test fails: what it decided, and why.
func logEnforcerOnFailure(t *testing.T) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for line := range strings.SplitSeq(s.node.AgentLog(), "\n") {
			if strings.Contains(line, `"enforce`) {
				t.Log(line)
			}
		}
	})
}

// testEnforcedNoGPU: a CUDA-image pod (the probe bakes in
// NVIDIA_VISIBLE_DEVICES=all) without a GPU limit sees no GPU, and its pod
// gets an Event saying what the enforcer changed. The enforcer read the
// pod's allocation as its sandbox started, and its container's creation
// waited on no read of its own.
func testEnforcedNoGPU(t *testing.T) {
	logEnforcerOnFailure(t)
	sandboxReads, creationReads := kubeletReads(t)
	report, pod := probe(t, tenantNS, probePod("enforced-no-gpu"))
	expectGPUs(t, report, nil)
	if v := report.Env["NVIDIA_VISIBLE_DEVICES"]; v != "void" {
		t.Errorf("the container ran with NVIDIA_VISIBLE_DEVICES=%q, want void from the enforcer", v)
	}
	expectEvent(t, pod, wellknown.ReasonContainerAdjusted, "NVIDIA_VISIBLE_DEVICES=void")
	sandboxAfter, creationAfter := kubeletReads(t)
	if sandboxAfter <= sandboxReads || creationAfter != creationReads {
		t.Errorf("the enforcer's reads of the kubelet: at sandboxes %v -> %v, at creations %v -> %v; want one more at the sandbox, none at the creation",
			sandboxReads, sandboxAfter, creationReads, creationAfter)
	}
}

// kubeletReads are the enforcer's reads of the kubelet's allocations so
// far: as sandboxes started, and at creations.
func kubeletReads(t *testing.T) (sandbox, creation float64) {
	t.Helper()
	m, err := s.node.AgentMetrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	const name = "gpuguard_agent_enforcer_kubelet_reads_total"
	return m[name+`{at="sandbox"}`], m[name+`{at="creation"}`]
}

// testEnforcedEnvAll: a one-GPU pod whose env asks for every GPU sees its
// own only. containerd keeps the image's, the device plugin's and the pod's
// values side by side and the runtime reads the last, which NRI's
// environment adjustment cannot reach: the enforcer narrows it through CDI,
// its void device and the toolkit spec's name of the allocated GPU.
func testEnforcedEnvAll(t *testing.T) {
	logEnforcerOnFailure(t)
	report, pod := probe(t, tenantNS, withEnv(gpuPod("enforced-env-all"), "NVIDIA_VISIBLE_DEVICES", "all"))
	expectAllocatedOnly(t, report, pod)
	expectEvent(t, pod, wellknown.ReasonContainerAdjusted, "through CDI")
}

// testEnforcedNoGPUEnvAll: a pod without a GPU limit whose env asks for
// every GPU on top of its image's sees none.
func testEnforcedNoGPUEnvAll(t *testing.T) {
	logEnforcerOnFailure(t)
	report, _ := probe(t, tenantNS, withEnv(probePod("enforced-no-gpu-env-all"), "NVIDIA_VISIBLE_DEVICES", "all"))
	expectGPUs(t, report, nil)
}

// testEnforcedSecret: a one-GPU pod pouring NVIDIA_VISIBLE_DEVICES=all in
// from a Secret (which admission never reads) sees its own GPU only.
func testEnforcedSecret(t *testing.T) {
	logEnforcerOnFailure(t)
	ctx := context.Background()
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{GenerateName: "gpus-"}, StringData: map[string]string{"NVIDIA_VISIBLE_DEVICES": "all"}}
	secret, err := s.cp.Client.CoreV1().Secrets(tenantNS).Create(ctx, secret, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.cp.Client.CoreV1().Secrets(tenantNS).Delete(ctx, secret.Name, metav1.DeleteOptions{}) })
	p := gpuPod("enforced-secret")
	p.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: secret.Name}}}}
	report, pod := probe(t, tenantNS, p)
	expectAllocatedOnly(t, report, pod)
}

// testEnforcedCDIAnnotation: on a node that passes cdi.k8s.io pod
// annotations to the runtime, a one-GPU pod asking for every GPU through
// one sees its own only.
func testEnforcedCDIAnnotation(t *testing.T) {
	logEnforcerOnFailure(t)
	report, pod := probe(t, tenantNS, withAnnotation(gpuPod("enforced-cdi"), cdiAllAnnotation, cdiAll))
	expectAllocatedOnly(t, report, pod)
}

// testEnforcedDeviceListMount: on a node whose runtime reads device lists
// from /dev/null mounts, a one-GPU pod that mounts one for every GPU sees
// its own only: the enforcer removes the mount the kubelet did not make.
func testEnforcedDeviceListMount(t *testing.T) {
	logEnforcerOnFailure(t)
	report, pod := probe(t, tenantNS, withDeviceListMount(gpuPod("enforced-mount"), "all"))
	expectAllocatedOnly(t, report, pod)
	expectEvent(t, pod, wellknown.ReasonContainerAdjusted, "removed device-list mount")
}

// testEnforcedTimeSliced: shares keep exactly their GPUs with the enforcer
// on (it resolves a share "<uuid>::<n>" to its GPU), and a one-share pod
// forging a device-list mount for every GPU still sees its share's GPU.
func testEnforcedTimeSliced(t *testing.T) {
	logEnforcerOnFailure(t)
	testTimeSlicedShares(t)
	report, p := probe(t, tenantNS, withDeviceListMount(sharePod("enforced-share-mount", 1), "all"))
	expectGPUs(t, report, sharedGPUs(t, p))
}

// testEnforcedInitContainer: a GPU init container keeps exactly its GPU.
// The kubelet's PodResources leaves such init containers out; the enforcer
// reads their allocation from the kubelet's device checkpoint, so it
// neither voids its GPU nor lets its env widen it.
func testEnforcedInitContainer(t *testing.T) {
	logEnforcerOnFailure(t)
	p := probePod("enforced-init")
	one := resource.MustParse("1")
	warmUp := p.Spec.Containers[0]
	warmUp.Name = "warm-up"
	warmUp.Resources = corev1.ResourceRequirements{Limits: corev1.ResourceList{gpuResource: one}, Requests: corev1.ResourceList{gpuResource: one}}
	warmUp.Env = append(warmUp.Env, corev1.EnvVar{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"})
	p.Spec.InitContainers = []corev1.Container{warmUp}
	report, pod, err := s.node.RunProbeContainer(context.Background(), tenantNS, p, warmUp.Name)
	if pod != nil {
		t.Cleanup(func() { _ = s.node.DeletePod(context.Background(), tenantNS, p.Name) })
	}
	if err != nil {
		t.Fatal(err)
	}
	if got := report.GPUs(); len(got) != 1 {
		t.Errorf("the GPU init container saw GPUs %v, want exactly one", got)
	}
}

// migResource is a MIG profile the MIG backend serves: GPU 0 carries four
// 1-slice instances of its A100-40GB.
const migResource = "nvidia.com/mig-1g.5gb"

// testEnforcedMIG: a MIG device keeps exactly itself, its parent GPU's
// node and no other GPU's, with its pod's env asking for every GPU or not.
// The enforcer names it by its own UUID, never its parent's.
func testEnforcedMIG(t *testing.T) {
	logEnforcerOnFailure(t)
	report, pod := probe(t, tenantNS, limitPod("enforced-mig", migResource))
	g := expectAllocatedOnlyOf(t, report, pod, migResource)
	if g.Index != 0 {
		t.Errorf("a %s device on GPU %d, want GPU 0's", migResource, g.Index)
	}
	report, pod = probe(t, tenantNS, withEnv(limitPod("enforced-mig-env-all", migResource), "NVIDIA_VISIBLE_DEVICES", "all"))
	expectAllocatedOnlyOf(t, report, pod, migResource)
	expectEvent(t, pod, wellknown.ReasonContainerAdjusted, "=MIG-")
}

// testEnforcedUnhonoured: a pod bound to the node asking for a GPU
// resource the node does not advertise gets nothing allocated, so nothing.
func testEnforcedUnhonoured(t *testing.T) {
	logEnforcerOnFailure(t)
	report, _ := probe(t, tenantNS, unhonouredPod("enforced-unhonoured"))
	expectGPUs(t, report, nil)
}

// testEnforcedPrivilegedRefused: a privileged container that no exemption
// covers is not created; the kubelet reports the enforcer's reason.
func testEnforcedPrivilegedRefused(t *testing.T) {
	logEnforcerOnFailure(t)
	p := probePod("enforced-privileged")
	p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: new(true)}
	expectRefused(t, p)
}

// testEnforcedBurst: a node creating containers in many pods at once,
// with none of the pods' allocations read yet (the enforcer restarted, as
// after an upgrade, once their sandboxes ran), beside another client of
// the kubelet's PodResources (a monitoring agent polling 80 times a
// second), makes the enforcer read the kubelet faster than the kubelet
// serves it (100 calls a second for all clients, in bursts of 10, turning
// the rest away). Every container is still judged, and adjusted to its
// allocation; none is refused for the kubelet's rate. The creations must
// each have read the kubelet, and the other client must have been turned
// away at least once, or the burst did not reach the kubelet's limit.
//
// One container a pod: a pod's read serves its other containers, so a
// burst within one pod makes one read, and shows nothing.
func testEnforcedBurst(t *testing.T) {
	logEnforcerOnFailure(t)
	const pods = 40
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sandboxes := make([]*heldSandbox, pods)
	stops := make([]func(), pods)
	startErrs := make([]error, pods)
	defer func() {
		for _, stop := range stops {
			if stop != nil {
				stop()
			}
		}
	}()
	var wg sync.WaitGroup
	for i := range pods {
		wg.Go(func() {
			sandboxes[i], stops[i], startErrs[i] = startHeldSandbox(ctx, fmt.Sprintf("enforced-burst-%d", i), fmt.Sprintf("burst-logs-%d", i))
		})
	}
	wg.Wait()
	if err := errors.Join(startErrs...); err != nil {
		t.Fatal(err)
	}
	// The restarted enforcer has read none of the pods.
	stopAgent(t)()
	metric := func(name string) float64 {
		m, err := s.node.AgentMetrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return m[name]
	}
	const adjusted, reads = `gpuguard_agent_enforcer_decisions_total{result="adjusted"}`, `gpuguard_agent_enforcer_kubelet_reads_total{at="creation"}`
	adjustedBefore, readsBefore := metric(adjusted), metric(reads)
	polling, stopPolling := context.WithCancel(ctx)
	turnedAway := make(chan int)
	go func() { turnedAway <- pollPodResources(polling, t, 80) }()
	ids := make([]string, pods)
	errs := make([]error, pods)
	for i, sb := range sandboxes {
		wg.Go(func() { ids[i], errs[i] = sb.create(ctx, "burst", kubenode.ProbeImage) })
	}
	wg.Wait()
	stopPolling()
	if n := <-turnedAway; n == 0 {
		t.Errorf("the kubelet turned none of the other client's calls away: the burst stayed within its rate, and shows nothing")
	}
	for i, id := range ids {
		if id != "" {
			_ = sandboxes[i].runtime.RemoveContainer(ctx, id)
		}
		if errs[i] != nil {
			t.Errorf("the container of pod %d of a burst of %d: %v", i, pods, errs[i])
		}
	}
	if got := metric(reads) - readsBefore; got != pods {
		t.Errorf("the burst's creations read the kubelet %v times, want %d: one a pod", got, pods)
	}
	if got := metric(adjusted) - adjustedBefore; got != pods {
		t.Errorf("the enforcer adjusted %v of the burst's %d containers (the probe image asks for every GPU), want all", got, pods)
	}
}

// pollPodResources lists the kubelet's pod resources perSecond times a
// second until ctx ends, as a monitoring agent does, and returns how many
// of its calls the kubelet turned away for its rate. It starts with a
// burst of ten, the kubelet's burst.
func pollPodResources(ctx context.Context, t *testing.T, perSecond int) (turnedAway int) {
	conn, err := grpc.NewClient("unix://"+s.node.PodResourcesSocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Error(err)
		return 0
	}
	defer conn.Close()
	client := podresourcesapi.NewPodResourcesListerClient(conn)
	list := func() {
		if _, err := client.List(ctx, &podresourcesapi.ListPodResourcesRequest{}); status.Code(err) == codes.ResourceExhausted {
			turnedAway++
		}
	}
	for range 10 {
		list()
	}
	tick := time.NewTicker(time.Second / time.Duration(perSecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return turnedAway
		case <-tick.C:
			list()
		}
	}
}

// expectRefused creates p and waits until the kubelet reports that the
// runtime refused its container for gpuguard; it must never run.
func expectRefused(t *testing.T, p *corev1.Pod) {
	t.Helper()
	expectCreateContainerError(t, p, "gpuguard")
}

// expectCreateContainerError creates p and waits until its container is
// refused at creation (CreateContainerError) with a message holding want;
// it must never run.
func expectCreateContainerError(t *testing.T, p *corev1.Pod, want string) {
	t.Helper()
	ctx := context.Background()
	pods := s.cp.Client.CoreV1().Pods(tenantNS)
	if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.node.DeletePod(ctx, tenantNS, p.Name) })
	var last string
	err := framework.Poll(ctx, time.Minute, func() (bool, error) {
		got, err := pods.Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, cs := range got.Status.ContainerStatuses {
			if cs.State.Running != nil || cs.State.Terminated != nil {
				return false, errors.New("the container ran")
			}
			if w := cs.State.Waiting; w != nil {
				last = w.Reason + ": " + w.Message
				return w.Reason == "CreateContainerError" && strings.Contains(w.Message, want), nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("%s: %v (last state %q), want CreateContainerError saying %q", p.Name, err, last, want)
	}
}

// expectEvent waits for an Event of reason on pod whose message holds want.
func expectEvent(t *testing.T, pod *corev1.Pod, reason, want string) {
	t.Helper()
	ctx := context.Background()
	err := framework.Poll(ctx, 30*time.Second, func() (bool, error) {
		evs, err := s.cp.Client.CoreV1().Events(pod.Namespace).List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.name=" + pod.Name + ",reason=" + reason})
		if err != nil {
			return false, nil
		}
		for _, e := range evs.Items {
			if strings.Contains(e.Message, want) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Errorf("no %s Event on %s saying %q: %v", reason, pod.Name, want, err)
	}
}

// testEnforcerDownFailsOpen: NRI skips a plugin that is not connected, so
// with the enforcer down a container is created as its pod says (here,
// with every GPU of its image's all); once the enforcer is back, the same
// container is judged again at its next start and sees none.
func testEnforcerDownFailsOpen(t *testing.T) {
	logEnforcerOnFailure(t)
	ctx := context.Background()
	startAgain := stopAgent(t)
	p := probePod("enforcer-down")
	p.Spec.RestartPolicy = corev1.RestartPolicyAlways
	if _, err := s.cp.Client.CoreV1().Pods(tenantNS).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.node.DeletePod(ctx, tenantNS, p.Name) })
	expectGPUs(t, runStartedAfter(t, p.Name, time.Time{}), allGPUs())
	// Stopped, the enforcer has released its Lease: the webhook's
	// injectVoid auto no longer counts the node as covered.
	expectLeaseHolder(t, "")
	uncovered := strings.Count(s.node.AgentLog(), "Lease coverage changed")
	startAgain()
	// Back and registered, it still does not count the node as covered:
	// this containerd creates containers while the enforcer is away, as
	// this pod's first run shows, so its Lease stays released.
	if err := framework.Poll(ctx, time.Minute, func() (bool, error) {
		return strings.Count(s.node.AgentLog(), "Lease coverage changed") > uncovered, nil
	}); err != nil {
		t.Fatalf("the enforcer did not judge its coverage: %v\n%s", err, s.node.AgentLogTail())
	}
	expectLeaseHolder(t, "")
	// StartedAt has whole seconds: only a run that began a full second
	// after the enforcer registered is surely its.
	back := time.Now().Truncate(time.Second).Add(time.Second)
	expectGPUs(t, runStartedAfter(t, p.Name, back), nil)
}

// testEnforcerRequired: with containerd's NRI default validator requiring
// the enforcer, a container is refused while it is down, and created,
// judged, once it is back.
func testEnforcerRequired(t *testing.T) {
	logEnforcerOnFailure(t)
	startAgain := stopAgent(t)
	p := probePod("enforcer-required")
	expectCreateContainerError(t, p, `required plugin "gpuguard"`)
	startAgain()
	expectGPUs(t, runStartedAfter(t, p.Name, time.Time{}), nil)
	// A node that fails closed counts as covered while its enforcer runs.
	expectLeaseHolder(t, nodeName)
}

// runStartedAfter waits for a run of pod name's probe container that began
// at or after after and has ended, and returns what it saw.
func runStartedAfter(t *testing.T, name string, after time.Time) kubenode.ProbeReport {
	t.Helper()
	ctx := context.Background()
	var report kubenode.ProbeReport
	var status string
	err := framework.Poll(ctx, 3*time.Minute, func() (bool, error) {
		pod, err := s.cp.Client.CoreV1().Pods(tenantNS).Get(ctx, name, metav1.GetOptions{})
		if err != nil || len(pod.Status.ContainerStatuses) == 0 {
			return false, nil
		}
		cs := pod.Status.ContainerStatuses[0]
		status = fmt.Sprintf("restarts %d, state %+v", cs.RestartCount, cs.State)
		for _, run := range []*corev1.ContainerStateTerminated{cs.State.Terminated, cs.LastTerminationState.Terminated} {
			if run != nil && run.ExitCode == 0 && !run.StartedAt.Time.Before(after) {
				return true, json.Unmarshal([]byte(run.Message), &report)
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no run of %s that began after %s ended: %v (%s)", name, after.Format(time.RFC3339), err, status)
	}
	t.Logf("%s (run begun after %s) saw GPUs %v, NVIDIA_VISIBLE_DEVICES=%q", name, after.Format(time.RFC3339), report.GPUs(), report.Env["NVIDIA_VISIBLE_DEVICES"])
	return report
}

// expectLeaseHolder waits until the node enforcer's Lease is held by
// holder ("" for released).
func expectLeaseHolder(t *testing.T, holder string) {
	t.Helper()
	var got string
	var exists bool
	err := framework.Poll(context.Background(), 30*time.Second, func() (bool, error) {
		var err error
		got, exists, err = s.node.EnforcerLeaseHolder(context.Background())
		return exists && got == holder, err
	})
	if err != nil {
		t.Fatalf("the node enforcer's Lease: exists %v, held by %q; want held by %q: %v", exists, got, holder, err)
	}
}

// stopAgent stops the node's agent, enforcer and all, and returns what
// starts it again; the test's end starts it if the test did not.
func stopAgent(t *testing.T) (startAgain func()) {
	t.Helper()
	if err := s.node.StopAgent(); err != nil {
		t.Fatal(err)
	}
	up := false
	t.Cleanup(func() {
		if !up {
			_ = s.node.StartAgent(context.Background())
		}
	})
	return func() {
		t.Helper()
		if err := s.node.StartAgent(context.Background()); err != nil {
			t.Fatal(err)
		}
		up = true
	}
}
