package enforcer

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuguard/gpuguard/agent/verifier"
)

// TestInitContainerKeepsItsGPU: PodResources leaves out init containers
// that are not sidecars; the enforcer finds what was allocated to one in
// the kubelet's checkpoint, so a GPU init container keeps its GPU, and
// still no more than it.
func TestInitContainerKeepsItsGPU(t *testing.T) {
	dir := t.TempDir()
	checkpoint := `{"Data":{"PodDeviceEntries":[{"PodUID":"uid-train","ContainerName":"warm-up","ResourceName":"nvidia.com/gpu","DeviceIDs":{"-1":["GPU-a"]}}]},"Checksum":1}`
	if err := os.WriteFile(filepath.Join(dir, verifier.CheckpointFile), []byte(checkpoint), 0o600); err != nil {
		t.Fatal(err)
	}
	rules := &atomic.Pointer[Rules]{}
	rules.Store(testRules(t))
	decisions, latency := NewMetrics(prometheus.NewRegistry())
	// PodResources reports the pod's app container only.
	kubelet := fixedAllocations{{Namespace: "team-a", Pod: "train", Container: "main"}: {"nvidia.com/gpu": {"GPU-b"}}}
	for _, tc := range []struct {
		name       string
		checkpoint *verifier.Checkpoint
		env        string
		want       string // NVIDIA_VISIBLE_DEVICES after the adjustment; "" for unchanged
	}{
		{name: "its own GPU kept", checkpoint: verifier.NewCheckpoint(dir), env: "NVIDIA_VISIBLE_DEVICES=GPU-a"},
		{name: "all narrowed to its GPU", checkpoint: verifier.NewCheckpoint(dir), env: "NVIDIA_VISIBLE_DEVICES=all", want: "GPU-a"},
		{name: "without the checkpoint, its GPU taken away", env: "NVIDIA_VISIBLE_DEVICES=GPU-a", want: Void},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Plugin{Rules: rules, Allocations: kubelet, Checkpoint: tc.checkpoint, Exemptions: &verifier.Exemptions{},
				Log: logr.Discard(), Decisions: decisions, Latency: latency}
			req := createRequest("train", "warm-up", tc.env)
			adj, _, err := p.CreateContainer(context.Background(), req.Pod, req.Container)
			if err != nil {
				t.Fatal(err)
			}
			if got := envOf(adj)["NVIDIA_VISIBLE_DEVICES"]; got != tc.want {
				t.Errorf("NVIDIA_VISIBLE_DEVICES set to %q, want %q", got, tc.want)
			}
		})
	}
}
