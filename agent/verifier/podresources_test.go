package verifier

import (
	"context"
	"net"
	"path/filepath"
	"slices"
	"testing"

	"google.golang.org/grpc"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// kubeletPodResources serves a canned List over a unix socket, as the
// kubelet does on pod-resources/kubelet.sock.
type kubeletPodResources struct {
	podresourcesapi.UnimplementedPodResourcesListerServer
	resp *podresourcesapi.ListPodResourcesResponse
}

func (k *kubeletPodResources) List(context.Context, *podresourcesapi.ListPodResourcesRequest) (*podresourcesapi.ListPodResourcesResponse, error) {
	return k.resp, nil
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
