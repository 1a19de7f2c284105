package enforcer

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuguard/gpuguard/agent/verifier"
)

// validating is an enforcer on testNode with its CDI specs (the toolkit's
// and its own), the kubelet having allocated GPU-a to team-a/train/main.
func validating(t *testing.T) (*Plugin, *countedKubelet) {
	t.Helper()
	rules := &atomic.Pointer[Rules]{}
	rules.Store(cdiRules(t, specDir(t, true)))
	decisions, latency := NewMetrics(prometheus.NewRegistry())
	kubelet := &countedKubelet{allocs: verifier.Allocations{{Namespace: "team-a", Pod: "train", Container: "main"}: {"nvidia.com/gpu": {"GPU-a"}}}}
	return &Plugin{Rules: rules, Allocations: kubelet, Exemptions: &verifier.Exemptions{}, Log: logr.Discard(),
		Decisions: decisions, Latency: latency}, kubelet
}

// created runs the container's creation through p, as NRI does before it
// validates, and returns the request to validate with the enforcer's
// adjustment merged with more, another plugin's.
func created(t *testing.T, p *Plugin, req *api.CreateContainerRequest, more *api.ContainerAdjustment) *api.ValidateContainerAdjustmentRequest {
	t.Helper()
	own, _, err := p.CreateContainer(context.Background(), req.Pod, req.Container)
	if err != nil {
		t.Fatalf("refused at creation: %v", err)
	}
	merged := &api.ContainerAdjustment{}
	for _, adj := range []*api.ContainerAdjustment{own, more} {
		if adj == nil {
			continue
		}
		merged.Env = append(merged.Env, adj.Env...)
		merged.Mounts = append(merged.Mounts, adj.Mounts...)
		merged.CDIDevices = append(merged.CDIDevices, adj.CDIDevices...)
		for k, v := range adj.Annotations {
			if merged.Annotations == nil {
				merged.Annotations = map[string]string{}
			}
			merged.Annotations[k] = v
		}
		if adj.Linux != nil {
			if merged.Linux == nil {
				merged.Linux = &api.LinuxContainerAdjustment{Resources: &api.LinuxResources{}}
			}
			merged.Linux.Devices = append(merged.Linux.Devices, adj.Linux.Devices...)
			merged.Linux.Resources.Devices = append(merged.Linux.Resources.Devices, adj.Linux.GetResources().GetDevices()...)
		}
	}
	return &api.ValidateContainerAdjustmentRequest{Pod: req.Pod, Container: req.Container, Adjust: merged}
}

// TestValidateTheFinalSpec: at validation the enforcer judges the container
// as every plugin left it, those after it and the CDI devices they asked for
// included. A GPU device node, a CDI device or a device variable beyond the
// allocation, a protected variable, a cgroup rule for every GPU, and a CDI
// device no spec defines get it rejected; its own adjustment, the allocated
// GPU's CDI device and the narrowing of a variable set twice through CDI
// pass. Without validation each of the first ran as the later plugin left
// it.
func TestValidateTheFinalSpec(t *testing.T) {
	gpuNode := func(path string, minor int64) *api.ContainerAdjustment {
		return &api.ContainerAdjustment{Linux: &api.LinuxContainerAdjustment{Devices: []*api.LinuxDevice{{Path: path, Type: "c", Major: GPUMajor, Minor: minor}}}}
	}
	cdiDevice := func(name string) *api.ContainerAdjustment {
		return &api.ContainerAdjustment{CDIDevices: []*api.CDIDevice{{Name: name}}}
	}
	env := func(k, v string) *api.ContainerAdjustment {
		adj := &api.ContainerAdjustment{}
		adj.AddEnv(k, v)
		return adj
	}
	for _, tc := range []struct {
		name, pod string
		env       []string
		more      *api.ContainerAdjustment
		rejecting string // "" where accepted
	}{
		{name: "the allocated GPU's node", pod: "train", more: gpuNode("/dev/nvidia0", 0)},
		{name: "a neighbour's GPU node", pod: "train", more: gpuNode("/dev/nvidia1", 1), rejecting: "/dev/nvidia1 (c 195:1)"},
		{name: "a GPU node under another path, no GPU allocated", pod: "notebook", more: gpuNode("/dev/gpu", 2), rejecting: "/dev/gpu (c 195:2)"},
		{name: "the allocated GPU through CDI", pod: "train", more: cdiDevice("nvidia.com/gpu=GPU-a")},
		{name: "a neighbour's GPU through CDI", pod: "train", more: cdiDevice("nvidia.com/gpu=GPU-b"), rejecting: "/dev/nvidia1 (c 195:1)"},
		{name: "a CDI device no spec defines", pod: "train", more: cdiDevice("vendor.com/gpu=all"), rejecting: "vendor.com/gpu=all"},
		{name: "a device variable set to all", pod: "train", env: []string{"NVIDIA_VISIBLE_DEVICES=GPU-a"},
			more: env("NVIDIA_VISIBLE_DEVICES", "all"), rejecting: `NVIDIA_VISIBLE_DEVICES=GPU-a (was "all")`},
		{name: "a device variable, no GPU allocated", pod: "notebook", more: env("NVIDIA_VISIBLE_DEVICES", "GPU-b"), rejecting: "NVIDIA_VISIBLE_DEVICES=void"},
		{name: "a protected variable", pod: "notebook", more: env("NVIDIA_MOFED", "enabled"), rejecting: "NVIDIA_MOFED=disabled"},
		{name: "a cgroup rule for every GPU", pod: "train", more: &api.ContainerAdjustment{Linux: &api.LinuxContainerAdjustment{
			Resources: &api.LinuxResources{Devices: []*api.LinuxDeviceCgroup{{Allow: true, Type: "c", Major: api.Int64(GPUMajor), Access: "rw"}}}}},
			rejecting: "c 195:* rw"},
		{name: "its own narrowing", pod: "train", env: []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_MOFED=enabled"}},
		{name: "its own narrowing of a variable set twice, through CDI", pod: "train",
			env: []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=all"}},
		{name: "a plain container", pod: "notebook", env: []string{"PATH=/bin"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := validating(t)
			req := created(t, p, createRequest(tc.pod, "main", tc.env...), tc.more)
			err := p.ValidateContainerAdjustment(context.Background(), req)
			switch {
			case tc.rejecting == "" && err != nil:
				t.Errorf("rejected: %v", err)
			case tc.rejecting != "" && (err == nil || !strings.Contains(err.Error(), tc.rejecting)):
				t.Errorf("%v, want rejected naming %q", err, tc.rejecting)
			case err != nil:
				t.Log(err)
			}
		})
	}
}

// TestValidationReadsNothingMore: validation judges with what the
// container's creation read; a container that reads nothing at its creation
// reads nothing at its validation.
func TestValidationReadsNothingMore(t *testing.T) {
	p, kubelet := validating(t)
	req := created(t, p, createRequest("train", "main", "NVIDIA_VISIBLE_DEVICES=all"), nil)
	if err := p.ValidateContainerAdjustment(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	req = created(t, p, createRequest("plain", "main", "PATH=/bin"), nil)
	if err := p.ValidateContainerAdjustment(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if n := kubelet.reads.Load(); n != 1 {
		t.Errorf("the kubelet was read %d times, want once (the GPU container's creation)", n)
	}
}
