package verifier

import (
	"context"
	"net"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// fakeRuntime serves the CRI calls the verifier makes over a unix socket, as
// containerd does: running containers with the kubelet's labels, a verbose
// status naming the PID, and a stream of container events.
type fakeRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	statusCalls atomic.Int32
	events      chan *runtimeapi.ContainerEventResponse
	// noPID leaves the PID out of verbose statuses.
	noPID bool
}

func (f *fakeRuntime) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{Version: "0.1.0", RuntimeName: "fake", RuntimeVersion: "1", RuntimeApiVersion: "v1"}, nil
}

func (f *fakeRuntime) ListContainers(_ context.Context, r *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	if r.GetFilter().GetState().GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING {
		return &runtimeapi.ListContainersResponse{}, nil
	}
	labels := func(pod, c string) map[string]string {
		return map[string]string{labelPodName: pod, labelPodNamespace: "team-a", labelPodUID: "uid-" + pod, labelContainerName: c}
	}
	return &runtimeapi.ListContainersResponse{Containers: []*runtimeapi.Container{
		{Id: "c1", Labels: labels("train", "main")},
		{Id: "c2", Labels: labels("train", "sidecar")},
		{Id: "not-kubelet", Labels: map[string]string{"io.containerd.image": "x"}},
	}}, nil
}

func (f *fakeRuntime) ContainerStatus(_ context.Context, r *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	f.statusCalls.Add(1)
	pid := map[string]string{"c1": "4001", "c2": "4002"}[r.GetContainerId()]
	if f.noPID {
		pid = "0"
	}
	// The fields cri-client checks in every status, as a runtime fills them.
	status := &runtimeapi.ContainerStatus{Id: r.GetContainerId(), Metadata: &runtimeapi.ContainerMetadata{Name: "main"},
		CreatedAt: 1, Image: &runtimeapi.ImageSpec{Image: "probe"}, ImageRef: "sha256:probe", State: runtimeapi.ContainerState_CONTAINER_RUNNING}
	return &runtimeapi.ContainerStatusResponse{Status: status,
		Info: map[string]string{"info": `{"pid": ` + pid + `}`}}, nil
}

func (f *fakeRuntime) GetContainerEvents(_ *runtimeapi.GetEventsRequest, stream runtimeapi.RuntimeService_GetContainerEventsServer) error {
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case e := <-f.events:
			if err := stream.Send(e); err != nil {
				return err
			}
		}
	}
}

func startFakeRuntime(t *testing.T) (*fakeRuntime, string) {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "containerd.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeRuntime{events: make(chan *runtimeapi.ContainerEventResponse)}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, f)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	return f, socket
}

func TestCRIListsTheKubeletsRunningContainers(t *testing.T) {
	f, socket := startFakeRuntime(t)
	ctx := context.Background()
	cri, err := DialCRI(ctx, socket)
	if err != nil {
		t.Fatal(err)
	}
	defer cri.Close()
	for range 2 {
		got, err := cri.Running(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := []Container{{ID: "c1", Key: key("team-a", "train", "main"), PodUID: "uid-train", PID: 4001},
			{ID: "c2", Key: key("team-a", "train", "sidecar"), PodUID: "uid-train", PID: 4002}}
		if !slices.Equal(got, want) {
			t.Errorf("running %+v, want %+v", got, want)
		}
	}
	if n := f.statusCalls.Load(); n != 2 {
		t.Errorf("%d status calls over two lists, want 2: a running container's PID is asked once", n)
	}
}

func TestCRIStartEventsWakeTheVerifier(t *testing.T) {
	f, socket := startFakeRuntime(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cri, err := DialCRI(ctx, socket)
	if err != nil {
		t.Fatal(err)
	}
	defer cri.Close()
	wake := make(chan struct{}, 1)
	go func() { _ = cri.WatchStarts(ctx, wake) }()
	send := func(typ runtimeapi.ContainerEventType) {
		select {
		case f.events <- &runtimeapi.ContainerEventResponse{ContainerId: "c3", ContainerEventType: typ}:
		case <-time.After(10 * time.Second):
			t.Fatal("the watcher never subscribed to container events")
		}
	}
	send(runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT)
	send(runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT)
	select {
	case <-wake:
	case <-time.After(10 * time.Second):
		t.Fatal("a container start did not wake the verifier")
	}
	select {
	case <-wake:
		t.Error("a stopped container woke the verifier")
	default:
	}
}

func TestCRIWithoutPIDsIsAnError(t *testing.T) {
	f, socket := startFakeRuntime(t)
	f.noPID = true
	cri, err := DialCRI(context.Background(), socket)
	if err != nil {
		t.Fatal(err)
	}
	defer cri.Close()
	if got, err := cri.Running(context.Background()); err == nil {
		t.Errorf("a runtime naming no PID gave %v and no error: the node would look empty", got)
	}
}
