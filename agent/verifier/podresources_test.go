package verifier

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpuguard/gpuguard/agent/discovery"
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
func serveKubelet(t *testing.T, k *kubeletPodResources, opts ...grpc.ServerOption) *PodResources {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "kubelet.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
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

// kubeletRateLimit turns calls beyond limit away as the kubelet's
// PodResources server does (pkg/kubelet/apis/grpc/ratelimit.go).
func kubeletRateLimit(limit *rate.Limiter) grpc.ServerOption {
	return grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handle grpc.UnaryHandler) (any, error) {
		if !limit.Allow() {
			return nil, status.Error(codes.ResourceExhausted, "rejected by rate limit")
		}
		return handle(ctx, req)
	})
}

// TestPodAllocationsWithinTheKubeletsRate: a node creating many containers
// at once reads beyond the kubelet's PodResources rate (100 calls a
// second, bursts of 10, for all its clients). Every read waits its turn
// rather than failing, and so every container is judged rather than
// refused, even after another client on the node took the kubelet's whole
// burst. A read that gets no turn before its deadline fails, naming the
// pod and the rate.
func TestPodAllocationsWithinTheKubeletsRate(t *testing.T) {
	resp := &podresourcesapi.ListPodResourcesResponse{PodResources: []*podresourcesapi.PodResources{
		{Name: "train", Namespace: "team-a", Containers: []*podresourcesapi.ContainerResources{
			{Name: "main", Devices: []*podresourcesapi.ContainerDevices{{ResourceName: "nvidia.com/gpu", DeviceIds: []string{"GPU-1"}}}}}},
	}}
	kubelet := rate.NewLimiter(kubeletQPS, kubeletBurst)
	k := &kubeletPodResources{resp: resp}
	pr := serveKubelet(t, k, kubeletRateLimit(kubelet))
	for kubelet.Allow() {
		// Another client on the node takes the burst.
	}
	const reads = 4 * kubeletBurst
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, reads)
	for range reads {
		wg.Go(func() {
			got, err := pr.PodAllocations(ctx, "team-a", "train")
			if err == nil && len(got[ContainerKey{"team-a", "train", "main"}]["nvidia.com/gpu"]) != 1 {
				err = fmt.Errorf("allocation %v", got)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("a read beyond the kubelet's burst: %v", err)
		}
	}
	if got := k.gets.Load(); got != reads {
		t.Errorf("the kubelet served %d Gets, want %d", got, reads)
	}

	never := serveKubelet(t, &kubeletPodResources{resp: resp}, kubeletRateLimit(rate.NewLimiter(0, 0)))
	short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := never.PodAllocations(short, "team-a", "train")
	if err == nil || !strings.Contains(err.Error(), "team-a/train") || !strings.Contains(err.Error(), "rate") {
		t.Errorf("a kubelet that never has a turn: err = %v, want one naming the pod and the rate", err)
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
					{DriverName: "gpu.nvidia.com", DeviceName: "gpu-3", CdiDevices: []*podresourcesapi.CDIDevice{{Name: "k8s.gpu.nvidia.com/claim=u1-gpu-3"}}},
					{DriverName: "example.com", DeviceName: "gpu-0"}, {DriverName: "notnvidia.com", DeviceName: "gpu-1"}}}}},
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
	if !slices.Equal(main[DRACDIResourcePrefix+"gpu.nvidia.com"], []string{"k8s.gpu.nvidia.com/claim=u1-gpu-3"}) {
		t.Errorf("the claim's CDI devices are missing: %v", main)
	}
	if _, ok := main["dra:example.com"]; ok {
		t.Errorf("a DRA claim of another vendor's driver was kept: %v", main)
	}
	if _, ok := main["dra:notnvidia.com"]; ok {
		t.Errorf("a DRA claim of a driver merely ending in nvidia.com was kept: %v", main)
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

// TestDRANamesAreMinors: NVIDIA's DRA driver names a GPU by its device
// node's minor ("gpu-<minor>"), which need not be its NVML index.
func TestDRANamesAreMinors(t *testing.T) {
	inv := &discovery.Inventory{GPUs: []discovery.GPU{{Index: 0, Minor: 1, UUID: "GPU-x"}, {Index: 1, Minor: 0, UUID: "GPU-y"}}}
	gpus := NewGPUResolver(inv).GPUs(map[string][]string{DRAResourcePrefix + "gpu.nvidia.com": {"gpu-1"}}, func(string) bool { return false })
	if want := []string{"GPU-x"}; !slices.Equal(sortedKeys(gpus), want) {
		t.Errorf("gpu-1 resolved to %v, want %v (the GPU of minor 1)", sortedKeys(gpus), want)
	}
}
