package enforcer

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuguard/gpuguard/agent/verifier"
)

// countedKubelet counts the reads of its allocations; while failing is set
// it fails them.
type countedKubelet struct {
	allocs  verifier.Allocations
	reads   atomic.Int32
	failing atomic.Bool
}

func (k *countedKubelet) Allocations(context.Context) (verifier.Allocations, error) {
	k.reads.Add(1)
	if k.failing.Load() {
		return nil, errors.New("the kubelet is restarting")
	}
	return k.allocs, nil
}

// TestPodReadOnceForItsContainers: the enforcer reads a pod's allocations
// when its sandbox starts, and its containers' creations use that read: a
// pod with an init container and two app containers costs the kubelet one
// read, and so do containers the read does not name (an init container
// found in the device checkpoint, a debug container).
// A read that failed, one of a removed sandbox and one no longer fresh are
// made again at the creation.
func TestPodReadOnceForItsContainers(t *testing.T) {
	kubelet := &countedKubelet{allocs: verifier.Allocations{
		{Namespace: "team-a", Pod: "train", Container: "warm-up"}: {"nvidia.com/gpu": {"GPU-a"}},
		{Namespace: "team-a", Pod: "train", Container: "main"}:    {"nvidia.com/gpu": {"GPU-a"}},
		{Namespace: "team-a", Pod: "train", Container: "logs"}:    {},
	}}
	rules := &atomic.Pointer[Rules]{}
	rules.Store(testRules(t))
	decisions, latency := NewMetrics(prometheus.NewRegistry())
	// An init container that is not a sidecar, which PodResources leaves
	// out, is in the device checkpoint only.
	dir := t.TempDir()
	checkpoint := `{"Data":{"PodDeviceEntries":[{"PodUID":"uid-train","ContainerName":"fetch","ResourceName":"nvidia.com/gpu","DeviceIDs":{"-1":["GPU-a"]}}]},"Checksum":1}`
	if err := os.WriteFile(filepath.Join(dir, verifier.CheckpointFile), []byte(checkpoint), 0o600); err != nil {
		t.Fatal(err)
	}
	p := &Plugin{Rules: rules, Allocations: kubelet, Checkpoint: verifier.NewCheckpoint(dir), Exemptions: &verifier.Exemptions{},
		Log: logr.Discard(), Decisions: decisions, Latency: latency}
	ctx := context.Background()
	create := func(ctr, env, want string) {
		t.Helper()
		req := createRequest("train", ctr, env)
		adj, _, err := p.CreateContainer(ctx, req.Pod, req.Container)
		if err != nil {
			t.Fatalf("%s: %v", ctr, err)
		}
		if got := envOf(adj)["NVIDIA_VISIBLE_DEVICES"]; got != want {
			t.Errorf("%s: NVIDIA_VISIBLE_DEVICES set to %q, want %q", ctr, got, want)
		}
	}
	expectReads := func(want int32, after string) {
		t.Helper()
		if got := kubelet.reads.Swap(0); got != want {
			t.Errorf("%s: %d reads of the kubelet, want %d", after, got, want)
		}
	}
	sandbox := createRequest("train", "").Pod
	if err := p.RunPodSandbox(ctx, sandbox); err != nil {
		t.Fatal(err)
	}
	create("warm-up", "NVIDIA_VISIBLE_DEVICES=all", "GPU-a")
	create("main", "NVIDIA_VISIBLE_DEVICES=all", "GPU-a")
	create("logs", "NVIDIA_VISIBLE_DEVICES=all", Void)
	expectReads(1, "a sandbox and three containers")

	create("fetch", "NVIDIA_VISIBLE_DEVICES=all", "GPU-a")
	create("debug", "NVIDIA_VISIBLE_DEVICES=all", Void)
	expectReads(0, "containers the read does not name")

	if err := p.RemovePodSandbox(ctx, sandbox); err != nil {
		t.Fatal(err)
	}
	create("main", "NVIDIA_VISIBLE_DEVICES=all", "GPU-a")
	expectReads(1, "a container of a removed sandbox")

	p.reads.put(sandbox.GetUid(), time.Now().Add(-readFresh), kubelet.allocs)
	create("main", "NVIDIA_VISIBLE_DEVICES=all", "GPU-a")
	expectReads(1, "a read no longer fresh")

	p.reads.forget(sandbox.GetUid())
	kubelet.failing.Store(true)
	if err := p.RunPodSandbox(ctx, sandbox); err != nil {
		t.Fatal(err)
	}
	req := createRequest("train", "main", "NVIDIA_VISIBLE_DEVICES=all")
	if _, _, err := p.CreateContainer(ctx, req.Pod, req.Container); err == nil {
		t.Error("with the kubelet failing, a container was created")
	}
	kubelet.failing.Store(false)
	expectReads(2, "a failed read at the sandbox")
	create("main", "NVIDIA_VISIBLE_DEVICES=all", "GPU-a")
	expectReads(1, "a read after the failed ones")
}
