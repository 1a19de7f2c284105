package verifier

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// kubeletPodResources serves a canned List over a unix socket, as the
// kubelet does on pod-resources/kubelet.sock.
type kubeletPodResources struct {
	podresourcesapi.UnimplementedPodResourcesListerServer
	resp *podresourcesapi.ListPodResourcesResponse
	// getDisabled answers Get as a kubelet with the feature gate off does.
	getDisabled bool
	// getFails answers Get with an unexpected error.
	getFails    bool
	lists, gets atomic.Int32
}

func (k *kubeletPodResources) List(context.Context, *podresourcesapi.ListPodResourcesRequest) (*podresourcesapi.ListPodResourcesResponse, error) {
	k.lists.Add(1)
	return k.resp, nil
}

func (k *kubeletPodResources) Get(_ context.Context, req *podresourcesapi.GetPodResourcesRequest) (*podresourcesapi.GetPodResourcesResponse, error) {
	k.gets.Add(1)
	if k.getDisabled {
		return nil, errors.New("PodResources API Get method disabled")
	}
	if k.getFails {
		return nil, errors.New("the kubelet is busy")
	}
	for _, p := range k.resp.GetPodResources() {
		if p.GetNamespace() == req.GetPodNamespace() && p.GetName() == req.GetPodName() {
			return &podresourcesapi.GetPodResourcesResponse{PodResources: p}, nil
		}
	}
	return nil, fmt.Errorf("pod %s in namespace %s not found", req.GetPodName(), req.GetPodNamespace())
}

// serveKubelet serves k on a unix socket and dials it.
func serveKubelet(t *testing.T, k *kubeletPodResources) *PodResources {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "kubelet.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	podresourcesapi.RegisterPodResourcesListerServer(srv, k)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	pr, err := DialPodResources(socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pr.Close() })
	return pr
}

// TestPodAllocationsByGet: one pod's allocations come from Get, not a List
// of every pod; a kubelet that has Get off is listed, and not asked again;
// a pod the kubelet does not know (another CRI client's) has nothing
// allocated, as in a List; any other error is an error.
func TestPodAllocationsByGet(t *testing.T) {
	resp := &podresourcesapi.ListPodResourcesResponse{PodResources: []*podresourcesapi.PodResources{
		{Name: "train", Namespace: "team-a", Containers: []*podresourcesapi.ContainerResources{
			{Name: "main", Devices: []*podresourcesapi.ContainerDevices{{ResourceName: "nvidia.com/gpu", DeviceIds: []string{"GPU-1"}}}}}},
		{Name: "other", Namespace: "team-b", Containers: []*podresourcesapi.ContainerResources{{Name: "main"}}},
	}}
	ctx := context.Background()
	for _, disabled := range []bool{false, true} {
		k := &kubeletPodResources{resp: resp, getDisabled: disabled}
		pr := serveKubelet(t, k)
		for range 2 {
			got, err := pr.PodAllocations(ctx, "team-a", "train")
			if err != nil {
				t.Fatal(err)
			}
			if ids := got[ContainerKey{"team-a", "train", "main"}]["nvidia.com/gpu"]; !slices.Equal(ids, []string{"GPU-1"}) {
				t.Errorf("Get disabled %v: allocation %v", disabled, got)
			}
		}
		wantGets, wantLists := int32(2), int32(0)
		if disabled {
			wantGets, wantLists = 1, 2
		}
		if k.gets.Load() != wantGets || k.lists.Load() != wantLists {
			t.Errorf("Get disabled %v: %d Gets and %d Lists, want %d and %d", disabled, k.gets.Load(), k.lists.Load(), wantGets, wantLists)
		}
	}
	pr := serveKubelet(t, &kubeletPodResources{resp: resp})
	if got, err := pr.PodAllocations(ctx, "team-a", "ghost"); err != nil || len(got) != 0 {
		t.Errorf("an unknown pod: %v, %v; want nothing allocated", got, err)
	}
	pr = serveKubelet(t, &kubeletPodResources{resp: resp, getFails: true})
	if _, err := pr.PodAllocations(ctx, "team-a", "train"); err == nil || !strings.Contains(err.Error(), "team-a/train") {
		t.Errorf("a failing Get: err = %v, want one naming the pod", err)
	}
}

func TestPodResourcesOverTheKubeletSocket(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "kubelet.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	podresourcesapi.RegisterPodResourcesListerServer(srv, &kubeletPodResources{resp: &podresourcesapi.ListPodResourcesResponse{
		PodResources: []*podresourcesapi.PodResources{{Name: "train", Namespace: "team-a", Containers: []*podresourcesapi.ContainerResources{
			{Name: "main",
				Devices: []*podresourcesapi.ContainerDevices{{ResourceName: "nvidia.com/gpu", DeviceIds: []string{"GPU-1", "GPU-2"}},
					{ResourceName: "example.com/nic", DeviceIds: []string{"eth1"}}},
				DynamicResources: []*podresourcesapi.DynamicResource{{ClaimName: "gpu", ClaimResources: []*podresourcesapi.ClaimResource{
					{DriverName: "gpu.nvidia.com", DeviceName: "gpu-3"}, {DriverName: "example.com", DeviceName: "gpu-0"}}}}},
			{Name: "sidecar"},
		}}},
	}})
	go func() { _ = srv.Serve(l) }()
	defer srv.Stop()

	pr, err := DialPodResources(socket)
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	got, err := pr.Allocations(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	main := got[ContainerKey{"team-a", "train", "main"}]
	if !slices.Equal(main["nvidia.com/gpu"], []string{"GPU-1", "GPU-2"}) || !slices.Equal(main["dra:gpu.nvidia.com"], []string{"gpu-3"}) {
		t.Errorf("allocation of main = %v", main)
	}
	if _, ok := main["dra:example.com"]; ok {
		t.Errorf("a DRA claim of another vendor's driver was kept: %v", main)
	}
	if _, ok := got[ContainerKey{"team-a", "train", "sidecar"}]; !ok {
		t.Errorf("the sidecar without devices is missing: %v", got)
	}
	gpus := NewGPUResolver(testInventory()).GPUs(main, func(r string) bool { return r == "nvidia.com/gpu" })
	if want := []string{"GPU-1", "GPU-2", "GPU-3"}; !slices.Equal(sortedKeys(gpus), want) {
		t.Errorf("allocated GPUs %v, want %v", sortedKeys(gpus), want)
	}
}

func TestPodResourcesKubeletAway(t *testing.T) {
	pr, err := DialPodResources(filepath.Join(t.TempDir(), "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	if _, err := pr.Allocations(context.Background()); err == nil {
		t.Error("want an error while the kubelet's socket is absent")
	}
}
