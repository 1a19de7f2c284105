package plugin

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuguard/gpuguard/agent/discovery/discoverytest"
	"github.com/gpuguard/gpuguard/agent/rm"
	"github.com/gpuguard/gpuguard/agent/strategy"
	"github.com/gpuguard/gpuguard/testsupport/kubelettest"
)

// shortDir is a socket directory short enough for unix socket paths.
func shortDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("", "gg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func mockResources(t testing.TB, spec, mig string) []rm.Resource {
	t.Helper()
	rs, err := rm.BuildResources(discoverytest.Inventory(t, spec), mig)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func builder(t testing.TB, list string, ids strategy.IDStrategy) *strategy.Builder {
	t.Helper()
	l, err := strategy.Parse(list)
	if err != nil {
		t.Fatal(err)
	}
	return &strategy.Builder{Strategies: l, IDs: ids, CDIKind: "nvidia.com/gpu"}
}

// startPlugin serves the GPU resource of a mock DGX A100 in a fresh dir.
func startPlugin(t testing.TB, list string) (*Plugin, string, pluginapi.DevicePluginClient) {
	t.Helper()
	return serveResource(t, mockResources(t, "mock:dgxa100", rm.MIGMixed)[0], list)
}

// serveResource serves r in a fresh dir and dials it.
func serveResource(t testing.TB, r rm.Resource, list string) (*Plugin, string, pluginapi.DevicePluginClient) {
	t.Helper()
	dir := shortDir(t)
	p := New(Options{Devices: rm.New(r), Dir: dir, Builder: builder(t, list, strategy.IDUUID), Log: logr.Discard()})
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	c, closeFn, err := kubelettest.Dial(dir, p.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeFn)
	return p, dir, c
}

func TestRegisterAndListAndWatch(t *testing.T) {
	p, dir, c := startPlugin(t, "volume-mounts")
	k, err := kubelettest.Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Stop()
	if err := p.Register(ctxT(t), k.Socket); err != nil {
		t.Fatal(err)
	}
	regs := k.Registrations()
	if len(regs) != 1 || regs[0].ResourceName != rm.GPUResource || regs[0].Endpoint != "gpuguard-nvidia.com-gpu.sock" || !regs[0].Options.GetPreferredAllocationAvailable {
		t.Fatalf("registrations %v", regs)
	}

	stream, err := c.ListAndWatch(ctxT(t), &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Devices) != 8 {
		t.Fatalf("%d devices", len(first.Devices))
	}
	for i, d := range first.Devices {
		if d.Health != pluginapi.Healthy || !strings.HasPrefix(d.ID, "GPU-") {
			t.Errorf("device %d: %v", i, d)
		}
		if d.Topology == nil || len(d.Topology.Nodes) != 1 || d.Topology.Nodes[0].ID != int64(i/4) {
			t.Errorf("device %d topology %v", i, d.Topology)
		}
	}

	bad := first.Devices[5].ID
	p.SetHealth(bad, false, "XID 79")
	p.SetHealth("GPU-not-mine", false, "ignored")
	next, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range next.Devices {
		want := pluginapi.Healthy
		if d.ID == bad {
			want = pluginapi.Unhealthy
		}
		if d.Health != want {
			t.Errorf("%s: %s, want %s", d.ID, d.Health, want)
		}
	}
	p.SetHealth(bad, true, "")
	again, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if again.Devices[5].Health != pluginapi.Healthy {
		t.Errorf("recovered device: %v", again.Devices[5])
	}

	p.Stop()
	if _, err := stream.Recv(); err == nil {
		t.Error("stream still open after Stop")
	}
	if _, err := os.Stat(p.Socket()); !os.IsNotExist(err) {
		t.Errorf("socket left behind: %v", err)
	}
}

func TestRegisterWithoutKubeletFails(t *testing.T) {
	p, dir, _ := startPlugin(t, "envvar")
	err := p.Register(ctxT(t), filepath.Join(dir, "kubelet.sock"))
	if err == nil || !strings.Contains(err.Error(), "kubelet.sock") {
		t.Fatalf("got %v", err)
	}
}

func TestStartReplacesStaleSocket(t *testing.T) {
	dir := shortDir(t)
	rs := mockResources(t, "mock:dgxh100", rm.MIGMixed)
	if err := os.WriteFile(filepath.Join(dir, SocketName(rs[0].Name)), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	p := New(Options{Devices: rm.New(rs[0]), Dir: dir, Builder: builder(t, "envvar", strategy.IDUUID), Log: logr.Discard()})
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	if err := p.Start(); err == nil {
		t.Error("second Start: no error")
	}
}

func TestAllocateEveryStrategyOverTheSocket(t *testing.T) {
	cases := []struct {
		list  string
		check func(t *testing.T, ids []string, r *pluginapi.ContainerAllocateResponse)
	}{
		{"envvar", func(t *testing.T, ids []string, r *pluginapi.ContainerAllocateResponse) {
			if r.Envs["NVIDIA_VISIBLE_DEVICES"] != strings.Join(ids, ",") {
				t.Errorf("envs %v", r.Envs)
			}
		}},
		{"volume-mounts", func(t *testing.T, ids []string, r *pluginapi.ContainerAllocateResponse) {
			if r.Envs["NVIDIA_VISIBLE_DEVICES"] != strategy.VolumeMountRoot || len(r.Mounts) != len(ids) {
				t.Fatalf("%v", r)
			}
			for i, m := range r.Mounts {
				if m.HostPath != "/dev/null" || m.ContainerPath != strategy.VolumeMountRoot+"/"+ids[i] {
					t.Errorf("mount %v", m)
				}
			}
		}},
		{"cdi-annotations", func(t *testing.T, ids []string, r *pluginapi.ContainerAllocateResponse) {
			if len(r.Envs) != 0 || len(r.Annotations) != 1 {
				t.Fatalf("%v", r)
			}
			for k, v := range r.Annotations {
				if !strings.HasPrefix(k, "cdi.k8s.io/gpuguard-agent_") || v != "nvidia.com/gpu="+ids[0]+",nvidia.com/gpu="+ids[1] {
					t.Errorf("annotation %s=%s", k, v)
				}
			}
		}},
		{"cdi-cri", func(t *testing.T, ids []string, r *pluginapi.ContainerAllocateResponse) {
			if len(r.Envs) != 0 || len(r.CdiDevices) != 2 || r.CdiDevices[1].Name != "nvidia.com/gpu="+ids[1] {
				t.Fatalf("%v", r)
			}
		}},
		{"cdi-annotations,cdi-cri", func(t *testing.T, ids []string, r *pluginapi.ContainerAllocateResponse) {
			if len(r.Envs) != 0 || len(r.CdiDevices) != 2 || len(r.Annotations) != 1 {
				t.Fatalf("%v", r)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.list, func(t *testing.T) {
			_, _, c := startPlugin(t, tc.list)
			ids := deviceIDs(t, c)[2:4]
			resp, err := c.Allocate(ctxT(t), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}, {DevicesIds: ids[:1]}}})
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.ContainerResponses) != 2 {
				t.Fatalf("%d container responses", len(resp.ContainerResponses))
			}
			tc.check(t, ids, resp.ContainerResponses[0])
		})
	}
}

func TestAllocateIndexIDs(t *testing.T) {
	dir := shortDir(t)
	rs := mockResources(t, "mock:dgxa100:mig", rm.MIGMixed)
	var mig rm.Resource
	for _, r := range rs {
		if r.Name == "nvidia.com/mig-2g.10gb" {
			mig = r
		}
	}
	p := New(Options{Devices: rm.New(mig), Dir: dir, Builder: builder(t, "envvar", strategy.IDIndex), Log: logr.Discard()})
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	c, closeFn, _ := kubelettest.Dial(dir, p.Endpoint())
	defer closeFn()
	resp, err := c.Allocate(ctxT(t), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{mig.Devices[1].ID}}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.ContainerResponses[0].Envs["NVIDIA_VISIBLE_DEVICES"]; got != "1:1" {
		t.Fatalf("MIG index ID %q, want 1:1", got)
	}
}

// listDevices is the first device list the plugin sends.
func listDevices(t *testing.T, c pluginapi.DevicePluginClient) []*pluginapi.Device {
	t.Helper()
	stream, err := c.ListAndWatch(ctxT(t), &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	return r.Devices
}

func deviceIDs(t *testing.T, c pluginapi.DevicePluginClient) []string {
	t.Helper()
	var ids []string
	for _, d := range listDevices(t, c) {
		ids = append(ids, d.ID)
	}
	return ids
}

func TestBadRequestsAreInvalidArgument(t *testing.T) {
	_, _, c := startPlugin(t, "envvar")
	ids := deviceIDs(t, c)
	ctx := ctxT(t)
	allocs := map[string]*pluginapi.AllocateRequest{
		"nil containers":   {},
		"empty devices":    {ContainerRequests: []*pluginapi.ContainerAllocateRequest{{}}},
		"unknown device":   {ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{ids[0], "GPU-forged"}}}},
		"duplicate device": {ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{ids[1], ids[1]}}}},
		"replica suffix":   {ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{ids[1] + "::1"}}}},
	}
	for name, req := range allocs {
		_, err := c.Allocate(ctx, req)
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("Allocate %s: %v, want InvalidArgument", name, err)
		}
	}
	prefs := map[string]*pluginapi.ContainerPreferredAllocationRequest{
		"zero size":      {AvailableDeviceIDs: ids, AllocationSize: 0},
		"too large":      {AvailableDeviceIDs: ids[:2], AllocationSize: 3},
		"unknown":        {AvailableDeviceIDs: []string{"GPU-forged"}, AllocationSize: 1},
		"duplicate":      {AvailableDeviceIDs: []string{ids[0], ids[0]}, AllocationSize: 1},
		"must not avail": {AvailableDeviceIDs: ids[:2], MustIncludeDeviceIDs: ids[2:3], AllocationSize: 1},
		"must over size": {AvailableDeviceIDs: ids, MustIncludeDeviceIDs: ids[:3], AllocationSize: 2},
		"must duplicate": {AvailableDeviceIDs: ids, MustIncludeDeviceIDs: []string{ids[0], ids[0]}, AllocationSize: 2},
		"negative size":  {AvailableDeviceIDs: ids, AllocationSize: -1},
	}
	for name, cr := range prefs {
		_, err := c.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{cr}})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("GetPreferredAllocation %s: %v, want InvalidArgument", name, err)
		}
	}
	if _, err := c.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("empty preferred request: %v", err)
	}
	// Requests built in Go can hold what the wire cannot: nil entries.
	p, _, _ := startPlugin(t, "envvar")
	if _, err := p.Allocate(ctx, nil); status.Code(err) != codes.InvalidArgument {
		t.Errorf("Allocate(nil): %v", err)
	}
	if _, err := p.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{nil}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("Allocate with a nil container request: %v", err)
	}
	if _, err := p.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{nil}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("GetPreferredAllocation with a nil container request: %v", err)
	}
	// The server is still up.
	if o, err := c.GetDevicePluginOptions(ctx, &pluginapi.Empty{}); err != nil || !o.GetPreferredAllocationAvailable || o.PreStartRequired {
		t.Fatalf("options after bad requests: %v %v", o, err)
	}
	if _, err := c.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: ids[:1]}); err != nil {
		t.Fatalf("PreStartContainer: %v", err)
	}
}

// fakeNVIDIAPlugin answers GetDevicePluginOptions like any device plugin.
type fakeNVIDIAPlugin struct {
	pluginapi.UnimplementedDevicePluginServer
}

func (fakeNVIDIAPlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func serveFake(t *testing.T, path string) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(s, fakeNVIDIAPlugin{})
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
}

func TestFindOtherPlugins(t *testing.T) {
	dir := shortDir(t)
	ctx := ctxT(t)
	if got := FindOtherPlugins(ctx, dir); len(got) != 0 {
		t.Fatalf("empty dir: %v", got)
	}
	// Our own socket, the kubelet's, another vendor's and a dead NVIDIA one
	// do not count.
	serveFake(t, filepath.Join(dir, SocketName(rm.GPUResource)))
	serveFake(t, filepath.Join(dir, "kubelet.sock"))
	serveFake(t, filepath.Join(dir, "intel-gpu.sock"))
	dead, err := net.Listen("unix", filepath.Join(dir, "nvidia.sock"))
	if err != nil {
		t.Fatal(err)
	}
	dead.(*net.UnixListener).SetUnlinkOnClose(false)
	dead.Close()
	if err := os.WriteFile(filepath.Join(dir, "nvidia-notes.txt"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if got := FindOtherPlugins(ctx, dir); len(got) != 0 {
		t.Fatalf("nothing else serves NVIDIA GPUs, got %v", got)
	}
	serveFake(t, filepath.Join(dir, "nvidia-gpu.sock"))
	if got := FindOtherPlugins(ctx, dir); !slices.Equal(got, []string{"nvidia-gpu.sock"}) {
		t.Fatalf("got %v, want [nvidia-gpu.sock]", got)
	}
}
