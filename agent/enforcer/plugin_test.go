package enforcer

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpuguard/gpuguard/agent/verifier"
	"github.com/gpuguard/gpuguard/config"
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

// TestExemptionsReadOnlyWhereTheyMatter: with service accounts exempted,
// the enforcer reads a container's pod for its service account only where
// the decision would change the container. A GPU container within its
// allocation is created without a read of the API server, which a burst
// of creations would otherwise queue on; a container the decision would
// change is read, and left alone where its service account is exempt.
func TestExemptionsReadOnlyWhereTheyMatter(t *testing.T) {
	client := fake.NewClientset(
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "train", UID: "uid-train"}, Spec: corev1.PodSpec{ServiceAccountName: "trainer"}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "dcgm", UID: "uid-dcgm"}, Spec: corev1.PodSpec{ServiceAccountName: "dcgm-exporter"}})
	var reads atomic.Int32
	client.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) { reads.Add(1); return false, nil, nil })
	pol := config.Default()
	pol.Spec.Exemptions.ServiceAccounts = []config.ServiceAccountExemption{{Namespace: "team-a", Name: "dcgm-exporter"}}
	ex := &verifier.Exemptions{Client: client}
	ex.Set(pol, nil)
	rules := &atomic.Pointer[Rules]{}
	rules.Store(testRules(t))
	decisions, latency := NewMetrics(prometheus.NewRegistry())
	kubelet := fixedAllocations{{Namespace: "team-a", Pod: "train", Container: "main"}: {"nvidia.com/gpu": {"GPU-a"}}}
	p := &Plugin{Rules: rules, Allocations: kubelet, Exemptions: ex, Log: logr.Discard(), Decisions: decisions, Latency: latency}
	for _, tc := range []struct {
		name, pod, env string
		wantReads      int32
	}{
		{name: "a GPU container within its allocation", pod: "train", env: "NVIDIA_VISIBLE_DEVICES=GPU-a", wantReads: 0},
		{name: "an exempt container asking for every GPU", pod: "dcgm", env: "NVIDIA_VISIBLE_DEVICES=all", wantReads: 1},
	} {
		reads.Store(0)
		req := createRequest(tc.pod, "main", tc.env)
		adj, _, err := p.CreateContainer(context.Background(), req.Pod, req.Container)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if env := envOf(adj); len(env) != 0 {
			t.Errorf("%s: adjusted to %v, want unchanged", tc.name, env)
		}
		if got := reads.Load(); got != tc.wantReads {
			t.Errorf("%s: %d reads of its pod, want %d", tc.name, got, tc.wantReads)
		}
	}
}
