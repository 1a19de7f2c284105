package verifier

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// kubeletCheckpoint is a device manager checkpoint as the kubelet writes
// it: an init container's GPU, a sidecar's, and a GPU listed under two
// NUMA nodes.
const kubeletCheckpoint = `{"Data":{"PodDeviceEntries":[
{"PodUID":"uid-train","ContainerName":"warm-up","ResourceName":"nvidia.com/gpu","DeviceIDs":{"0":["GPU-1"]},"AllocResp":"CiAKFk5WSURJQV9WSVNJQkxFX0RFVklDRVMSBkdQVS0x"},
{"PodUID":"uid-train","ContainerName":"main","ResourceName":"nvidia.com/gpu","DeviceIDs":{"0":["GPU-1","GPU-2"],"1":["GPU-2"]},"AllocResp":""}],
"RegisteredDevices":{"nvidia.com/gpu":["GPU-1","GPU-2"]}},"Checksum":1234}`

// TestCheckpointInitContainers: the checkpoint gives an init container's
// devices, which PodResources leaves out; a missing file is no allocation,
// a malformed one an error naming it.
func TestCheckpointInitContainers(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, CheckpointFile), []byte(kubeletCheckpoint), 0o600); err != nil {
		t.Fatal(err)
	}
	cp := NewCheckpoint(dir)
	got, ok, err := cp.Container("uid-train", "warm-up")
	if err != nil || !ok || !slices.Equal(got["nvidia.com/gpu"], []string{"GPU-1"}) {
		t.Errorf("warm-up: %v, %v, %v", got, ok, err)
	}
	if got, _, _ := cp.Container("uid-train", "main"); !slices.Equal(got["nvidia.com/gpu"], []string{"GPU-1", "GPU-2"}) {
		t.Errorf("main, a GPU on two NUMA nodes: %v", got)
	}
	if _, ok, err := cp.Container("uid-other", "main"); ok || err != nil {
		t.Errorf("another pod: recorded %v, %v", ok, err)
	}
	if pods, err := NewCheckpoint(t.TempDir()).Pods(); err != nil || len(pods) != 0 {
		t.Errorf("no checkpoint: %v, %v", pods, err)
	}
	if err := os.WriteFile(filepath.Join(dir, CheckpointFile), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := cp.Container("uid-train", "warm-up"); err == nil || !strings.Contains(err.Error(), dir) {
		t.Errorf("a malformed checkpoint: err = %v, want one naming it", err)
	}
}
