//go:build e2e

package node

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuguard/gpuguard/e2e/framework"
)

// A node whose containerd requires the enforcer counts as covered while
// the enforcer holds its Lease: the webhook (injectVoid auto) then admits a
// GPU pod without void, and the pod's container asks for every GPU (its
// image's NVIDIA_VISIBLE_DEVICES=all, here its env too) each time it
// starts. These scenarios start such a container, first run while the
// enforcer is registered, again while the enforcer cannot answer: it is
// refused, never run with every GPU, and runs with its own GPU once the
// enforcer is back.

// testRequiredAgentRestart: the agent stopped for a restart or a rolling
// update releases its Lease; a container start in that window is refused.
func testRequiredAgentRestart(t *testing.T) {
	expectRestartRefused(t, "required-agent-restart", func() (back func()) {
		startAgain := stopAgent(t)
		expectLeaseHolder(t, "")
		return startAgain
	})
}

// testRequiredAgentKilled: the agent killed with SIGKILL (an OOM kill)
// releases nothing: its Lease stays held, and the node counted covered,
// until the Lease goes stale. A container start in that window is refused.
func testRequiredAgentKilled(t *testing.T) {
	expectRestartRefused(t, "required-agent-killed", func() (back func()) {
		if err := s.node.KillAgent(); err != nil {
			t.Fatal(err)
		}
		up := false
		t.Cleanup(func() {
			if !up {
				_ = s.node.StartAgent(context.Background())
			}
		})
		if holder, _, err := s.node.EnforcerLeaseHolder(context.Background()); err != nil || holder != nodeName {
			t.Fatalf("killed, the enforcer's Lease is held by %q (%v), want still %q: the window this scenario measures", holder, err, nodeName)
		}
		return func() {
			if err := s.node.StartAgent(context.Background()); err != nil {
				t.Fatal(err)
			}
			up = true
		}
	})
}

// testRequiredContainerdRestart: containerd restarted comes back before the
// enforcer has connected to it again (frozen here, so that the window
// lasts until the test closes it, rather than the enforcer's few seconds
// of reconnection). A container start in that window is refused.
func testRequiredContainerdRestart(t *testing.T) {
	expectRestartRefused(t, "required-containerd-restart", func() (back func()) {
		if err := s.node.FreezeAgent(); err != nil {
			t.Fatal(err)
		}
		thawed := false
		t.Cleanup(func() {
			if !thawed {
				_ = s.node.ThawAgent(context.Background())
			}
		})
		if err := s.node.RestartContainerd(context.Background()); err != nil {
			t.Fatal(err)
		}
		return func() {
			thawed = true
			if err := s.node.ThawAgent(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// expectRestartRefused runs a one-GPU pod asking for every GPU, which
// restarts whenever its container ends: its first run, with the enforcer
// registered, sees its own GPU; then down takes the enforcer away, and the
// container's next start is refused by containerd (required plugin
// missing) and never runs; once the function down returned brings the
// enforcer back, the container runs again and sees its own GPU only.
func expectRestartRefused(t *testing.T, prefix string, down func() (back func())) {
	t.Helper()
	logEnforcerOnFailure(t)
	ctx := context.Background()
	pods := s.cp.Client.CoreV1().Pods(tenantNS)
	p := withEnv(gpuPod(prefix), "NVIDIA_VISIBLE_DEVICES", "all")
	p.Spec.RestartPolicy = corev1.RestartPolicyAlways
	if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.node.DeletePod(ctx, tenantNS, p.Name) })
	first := runStartedAfter(t, p.Name, time.Time{})
	pod, err := pods.Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	own := expectAllocatedOnly(t, first, pod)

	back := down()
	// Runs from here on began with the enforcer away: whole seconds, so
	// the next one after this is surely in the window.
	wentDown := time.Now().Truncate(time.Second).Add(time.Second)
	expectStartRefused(t, p.Name, wentDown)
	back()
	report := runStartedAfter(t, p.Name, time.Now().Truncate(time.Second).Add(time.Second))
	pod, err = pods.Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if again := expectAllocatedOnly(t, report, pod); again != own {
		t.Errorf("back, the container saw %v; its allocation is %v", again, own)
	}
}

// expectStartRefused waits until the kubelet reports pod name's container
// refused at creation for want of the required enforcer, and fails if it
// ran at all since since.
func expectStartRefused(t *testing.T, name string, since time.Time) {
	t.Helper()
	ctx := context.Background()
	var last string
	err := framework.Poll(ctx, 2*time.Minute, func() (bool, error) {
		pod, err := s.cp.Client.CoreV1().Pods(tenantNS).Get(ctx, name, metav1.GetOptions{})
		if err != nil || len(pod.Status.ContainerStatuses) == 0 {
			return false, nil
		}
		cs := pod.Status.ContainerStatuses[0]
		if r := cs.State.Running; r != nil && !r.StartedAt.Time.Before(since) {
			return false, fmt.Errorf("the container ran with the enforcer away (started %s)", r.StartedAt)
		}
		for _, run := range []*corev1.ContainerStateTerminated{cs.State.Terminated, cs.LastTerminationState.Terminated} {
			if run != nil && !run.StartedAt.Time.Before(since) {
				return false, fmt.Errorf("the container ran with the enforcer away (started %s): %s", run.StartedAt, run.Message)
			}
		}
		if w := cs.State.Waiting; w != nil {
			last = w.Reason + ": " + w.Message
			return w.Reason == "CreateContainerError" && strings.Contains(w.Message, `required plugin "gpuguard"`), nil
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("%s: %v (last state %q), want CreateContainerError for the required enforcer", name, err, last)
	}
}
