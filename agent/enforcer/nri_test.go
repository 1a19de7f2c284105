package enforcer

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	nrilog "github.com/containerd/nri/pkg/log"
	nrigen "github.com/containerd/nri/pkg/runtime-tools/generate"
	"github.com/containerd/nri/pkg/stub"
	"github.com/go-logr/logr"
	rspec "github.com/opencontainers/runtime-spec/specs-go"
	rgen "github.com/opencontainers/runtime-tools/generate"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuguard/gpuguard/agent/verifier"
)

// fixedAllocations is a kubelet whose PodResources report allocs.
type fixedAllocations verifier.Allocations

func (f fixedAllocations) Allocations(context.Context) (verifier.Allocations, error) {
	return verifier.Allocations(f), nil
}

// quietNRI sets the NRI library's logger once: it is a global, which the
// goroutines of an earlier test's runtime may still read.
var quietNRI sync.Once

// startRuntime runs NRI's runtime side, the adaptation library containerd
// and CRI-O embed, on a unix socket, with no container to synchronise.
func startRuntime(t testing.TB) (*adaptation.Adaptation, string) {
	t.Helper()
	dir := t.TempDir()
	socket := filepath.Join(dir, "nri.sock")
	sync := func(ctx context.Context, cb adaptation.SyncCB) error {
		_, err := cb(ctx, nil, nil)
		return err
	}
	update := func(context.Context, []*api.ContainerUpdate) ([]*api.ContainerUpdate, error) { return nil, nil }
	quietNRI.Do(func() { nrilog.Set(nriLog{logr.Discard()}) })
	r, err := adaptation.New("runtime", "v1", sync, update, adaptation.WithSocketPath(socket),
		adaptation.WithPluginPath(filepath.Join(dir, "plugins")), adaptation.WithPluginConfigPath(filepath.Join(dir, "conf.d")))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return r, socket
}

// startEnforcer connects the enforcer to the runtime on socket, the kubelet
// having allocated GPU-a to team-a/train/main.
func startEnforcer(t testing.TB, socket string) {
	t.Helper()
	startEnforcerWith(t, socket, fixedAllocations{{Namespace: "team-a", Pod: "train", Container: "main"}: {"nvidia.com/gpu": {"GPU-a"}}})
}

// startEnforcerWith connects the enforcer, reading allocations from allocs.
func startEnforcerWith(t testing.TB, socket string, allocs verifier.AllocationSource) {
	t.Helper()
	rules := &atomic.Pointer[Rules]{}
	rules.Store(testRules(t))
	reg := prometheus.NewRegistry()
	decisions, latency := NewMetrics(reg)
	p := &Plugin{Rules: rules, Exemptions: &verifier.Exemptions{}, Log: logr.Discard(), Decisions: decisions, Latency: latency,
		Allocations: allocs}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.Run(ctx, socket, 100*time.Millisecond)
	}()
	t.Cleanup(func() { cancel(); <-done })
}

func createRequest(pod, ctr string, env ...string) *api.CreateContainerRequest {
	return &api.CreateContainerRequest{
		Pod:       &api.PodSandbox{Id: "sb-" + pod, Name: pod, Uid: "uid-" + pod, Namespace: "team-a"},
		Container: &api.Container{Id: "c-" + pod + "-" + ctr, PodSandboxId: "sb-" + pod, Name: ctr, Env: env},
	}
}

// waitAdjusted creates req until a plugin adjusts it: the enforcer has
// registered once it does.
func waitAdjusted(t testing.TB, r *adaptation.Adaptation, req *api.CreateContainerRequest) *api.CreateContainerResponse {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := r.CreateContainer(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetAdjust() != nil && len(resp.GetAdjust().GetEnv()) > 0 {
			return resp
		}
		if time.Now().After(deadline) {
			t.Fatal("the enforcer did not register with the runtime within 10s")
		}
		time.Sleep(20 * time.Millisecond) // polling interval of the registration wait
	}
}

// TestEnforcerThroughNRI: through NRI's real runtime side and protocol, the
// enforcer voids a container without GPUs, narrows one with its
// allocation, and refuses a privileged one, with its reason reaching the
// runtime as the creation's error.
func TestEnforcerThroughNRI(t *testing.T) {
	r, socket := startRuntime(t)
	startEnforcer(t, socket)
	resp := waitAdjusted(t, r, createRequest("notebook", "main", "NVIDIA_VISIBLE_DEVICES=all"))
	if env := envOf(resp.GetAdjust()); env["NVIDIA_VISIBLE_DEVICES"] != Void {
		t.Errorf("a container without GPUs: adjusted env %v, want NVIDIA_VISIBLE_DEVICES=void", env)
	}
	resp, err := r.CreateContainer(context.Background(), createRequest("train", "main", "NVIDIA_VISIBLE_DEVICES=all"))
	if err != nil {
		t.Fatal(err)
	}
	if env := envOf(resp.GetAdjust()); env["NVIDIA_VISIBLE_DEVICES"] != "GPU-a" {
		t.Errorf("a container allocated GPU-a: adjusted env %v, want NVIDIA_VISIBLE_DEVICES=GPU-a", env)
	}
	privileged := createRequest("root", "main")
	privileged.Container.Linux = &api.LinuxContainer{Resources: &api.LinuxResources{Devices: []*api.LinuxDeviceCgroup{{Allow: true, Access: "rwm"}}}}
	if _, err := r.CreateContainer(context.Background(), privileged); err == nil || !strings.Contains(err.Error(), "privileged") {
		t.Errorf("a privileged container: %v, want refused naming privileged", err)
	}
}

func envOf(adj *api.ContainerAdjustment) map[string]string {
	out := map[string]string{}
	for _, kv := range adj.GetEnv() {
		out[kv.GetKey()] = kv.GetValue()
	}
	return out
}

// noop is an NRI plugin that subscribes to container creation and changes
// nothing: the reference arm of the benchmark.
type noop struct{}

func (noop) CreateContainer(context.Context, *api.PodSandbox, *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	return nil, nil, nil
}

// BenchmarkCreateContainerThroughNRI measures what one container creation
// costs the runtime through NRI: with no plugin, with a plugin that does
// nothing (the protocol's own cost), and with the enforcer judging a
// container without GPUs whose image asks for all of them. The arms run
// alternately, in rounds, so that drift hits each alike.
func BenchmarkCreateContainerThroughNRI(b *testing.B) {
	arms := []string{"no plugin", "no-op plugin", "enforcer"}
	runtimes := map[string]*adaptation.Adaptation{}
	for _, arm := range arms {
		r, socket := startRuntime(b)
		runtimes[arm] = r
		switch arm {
		case "no-op plugin":
			s, err := stub.New(noop{}, stub.WithPluginName("noop"), stub.WithPluginIdx("10"), stub.WithSocketPath(socket))
			if err != nil {
				b.Fatal(err)
			}
			if err := s.Start(context.Background()); err != nil {
				b.Fatal(err)
			}
			b.Cleanup(s.Stop)
		case "enforcer":
			startEnforcer(b, socket)
			waitAdjusted(b, r, createRequest("warmup", "main", "NVIDIA_VISIBLE_DEVICES=all"))
		}
	}
	lat := map[string][]time.Duration{}
	req := createRequest("notebook", "main", "PATH=/usr/bin", "CUDA_VERSION=12.4", "NVIDIA_VISIBLE_DEVICES=all")
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, arm := range arms {
			t0 := time.Now()
			if _, err := runtimes[arm].CreateContainer(context.Background(), req); err != nil {
				b.Fatal(err)
			}
			lat[arm] = append(lat[arm], time.Since(t0))
		}
	}
	b.StopTimer()
	for _, arm := range arms {
		d := lat[arm]
		slices.Sort(d)
		pct := func(p float64) float64 { return float64(d[int(p*float64(len(d)-1))].Nanoseconds()) / 1e3 }
		name := strings.ReplaceAll(arm, " ", "-")
		b.ReportMetric(pct(0.50), fmt.Sprintf("%s-p50-µs", name))
		b.ReportMetric(pct(0.99), fmt.Sprintf("%s-p99-µs", name))
	}
}

// stalling is a kubelet whose PodResources answers nothing while stalled.
type stalling struct{ stalled atomic.Bool }

func (s *stalling) Allocations(ctx context.Context) (verifier.Allocations, error) {
	if s.stalled.Load() {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return verifier.Allocations{}, nil
}

// TestAStalledKubeletRefusesTheContainerNotThePlugin: when the kubelet
// does not answer, the enforcer refuses the container with a reason within
// its budget, before NRI's own request timeout, which would close the
// plugin and create containers without it until it reconnected; the next
// container is judged as usual.
func TestAStalledKubeletRefusesTheContainerNotThePlugin(t *testing.T) {
	r, socket := startRuntime(t)
	kubelet := &stalling{}
	startEnforcerWith(t, socket, kubelet)
	waitAdjusted(t, r, createRequest("first", "main", "NVIDIA_VISIBLE_DEVICES=all"))
	kubelet.stalled.Store(true)
	_, err := r.CreateContainer(context.Background(), createRequest("stalled", "main", "NVIDIA_VISIBLE_DEVICES=all"))
	if err == nil || !strings.Contains(err.Error(), "cannot read the kubelet's GPU allocation") {
		t.Fatalf("with the kubelet stalled: %v, want the container refused with the enforcer's reason", err)
	}
	// A container that grants nothing whatever was allocated is created
	// without asking the kubelet.
	if _, err := r.CreateContainer(context.Background(), createRequest("plain", "main", "PATH=/bin", "NVIDIA_VISIBLE_DEVICES=void")); err != nil {
		t.Fatalf("a container that needs no allocation, with the kubelet stalled: %v", err)
	}
	kubelet.stalled.Store(false)
	resp, err := r.CreateContainer(context.Background(), createRequest("after", "main", "NVIDIA_VISIBLE_DEVICES=all"))
	if err != nil || envOf(resp.GetAdjust())["NVIDIA_VISIBLE_DEVICES"] != Void {
		t.Fatalf("the next container: %v, adjustment %v; want void from an enforcer still connected", err, resp.GetAdjust())
	}
}

// finalSpec applies the adjustment NRI's runtime side answered for req as
// containerd does (NRI's spec generator), to the spec req's container was
// made from: what the runtime would run. It reads req before the creation,
// since NRI rewrites the request for later plugins.
func finalSpec(t *testing.T, r *adaptation.Adaptation, req *api.CreateContainerRequest) (*rspec.Spec, error) {
	t.Helper()
	spec := &rspec.Spec{Process: &rspec.Process{Env: slices.Clone(req.Container.Env)}, Linux: &rspec.Linux{}}
	for _, d := range req.Container.GetLinux().GetDevices() {
		spec.Linux.Devices = append(spec.Linux.Devices, d.ToOCI())
	}
	for _, m := range req.Container.GetMounts() {
		spec.Mounts = append(spec.Mounts, m.ToOCI(nil))
	}
	resp, err := r.CreateContainer(context.Background(), req)
	if err != nil {
		return nil, err
	}
	if err := nrigen.SpecGenerator(&rgen.Generator{Config: spec}).Adjust(resp.GetAdjust()); err != nil {
		t.Fatal(err)
	}
	return spec, nil
}

// TestFinalSpecThroughNRI checks what the runtime runs, not what the
// enforcer asked: NRI v0.11 does not pass on the removal of a variable the
// container already has, so a protected variable from the image or the pod
// must end with a value that grants nothing.
func TestFinalSpecThroughNRI(t *testing.T) {
	r, socket := startRuntime(t)
	startEnforcer(t, socket)
	waitAdjusted(t, r, createRequest("warmup", "main", "NVIDIA_VISIBLE_DEVICES=all"))
	for _, tc := range []struct {
		name, pod string
		env       []string
		want      map[string]string
		// mounts of /dev/null in the container, and those the runtime keeps.
		mounts, wantMounts []string
	}{
		{name: "no GPU, feature and channel variables from the image", pod: "notebook",
			env: []string{"PATH=/bin", "NVIDIA_MOFED=enabled", "NVIDIA_NVSWITCH=enabled", "NVIDIA_IMEX_CHANNELS=0",
				"NVIDIA_DRIVER_CAPABILITIES=all", "NVIDIA_MIG_CONFIG_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=all"},
			want: map[string]string{"PATH": "/bin", "NVIDIA_MOFED": "disabled", "NVIDIA_NVSWITCH": "disabled", "NVIDIA_IMEX_CHANNELS": Void,
				"NVIDIA_DRIVER_CAPABILITIES": "utility,compute", "NVIDIA_MIG_CONFIG_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": Void}},
		{name: "one GPU, MOFED which no workload may have", pod: "train",
			env:  []string{"NVIDIA_VISIBLE_DEVICES=GPU-a", "NVIDIA_MOFED=enabled", "NVIDIA_DRIVER_CAPABILITIES=compute"},
			want: map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-a", "NVIDIA_MOFED": "disabled", "NVIDIA_DRIVER_CAPABILITIES": "compute"}},
		{name: "one GPU, device-list mounts past the root without a slash", pod: "train",
			env: []string{"NVIDIA_VISIBLE_DEVICES=" + mountRoot}, want: map[string]string{"NVIDIA_VISIBLE_DEVICES": mountRoot},
			mounts:     []string{mountRoot + "/GPU-a", mountRoot + "all", "/run/nvidia-container-devicesGPU-b"},
			wantMounts: []string{mountRoot + "/GPU-a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := createRequest(tc.pod, "main", tc.env...)
			for _, m := range tc.mounts {
				req.Container.Mounts = append(req.Container.Mounts, &api.Mount{Destination: m, Source: "/dev/null", Type: "bind"})
			}
			spec, err := finalSpec(t, r, req)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := envMap(spec.Process.Env)
			if !maps.Equal(got, tc.want) {
				t.Errorf("the runtime runs with env %v, want %v", got, tc.want)
			}
			var mounts []string
			for _, m := range spec.Mounts {
				mounts = append(mounts, m.Destination)
			}
			if !slices.Equal(mounts, tc.wantMounts) {
				t.Errorf("the runtime mounts %v, want %v", mounts, tc.wantMounts)
			}
		})
	}
}

// TestDevicesThroughNRI: NRI v0.11 passes on no removal of a device node
// the container already has (adjustDevices), so such a removal left the
// node in the spec the runtime runs; a GPU's node under another path, and
// a cgroup rule for every GPU minor, now get the creation refused, naming
// them, while the allocated GPU's node is created as it is.
func TestDevicesThroughNRI(t *testing.T) {
	r, socket := startRuntime(t)
	startEnforcer(t, socket)
	waitAdjusted(t, r, createRequest("warmup", "main", "NVIDIA_VISIBLE_DEVICES=all"))
	withDevices := func(pod string, devices []*api.LinuxDevice, rules ...*api.LinuxDeviceCgroup) *api.CreateContainerRequest {
		req := createRequest(pod, "main")
		req.Container.Linux = &api.LinuxContainer{Devices: devices, Resources: &api.LinuxResources{Devices: rules}}
		return req
	}
	gpu := func(path string, minor int64) *api.LinuxDevice {
		return &api.LinuxDevice{Path: path, Type: "c", Major: GPUMajor, Minor: minor}
	}
	rule := func(minor *int64) *api.LinuxDeviceCgroup {
		return &api.LinuxDeviceCgroup{Allow: true, Type: "c", Major: api.Int64(GPUMajor), Minor: api.Int64(minor), Access: "rwm"}
	}
	spec, err := finalSpec(t, r, withDevices("train", []*api.LinuxDevice{gpu("/dev/nvidia0", 0)}, rule(i64(0))))
	if err != nil {
		t.Fatalf("the allocated GPU's node: %v", err)
	}
	if len(spec.Linux.Devices) != 1 || spec.Linux.Devices[0].Path != "/dev/nvidia0" {
		t.Errorf("the allocated GPU's node: the runtime runs with %v", spec.Linux.Devices)
	}
	for _, tc := range []struct {
		name     string
		req      *api.CreateContainerRequest
		refusing string
	}{
		{"a GPU's node under another path", withDevices("notebook", []*api.LinuxDevice{gpu("/dev/gpu-b", 1)}), "/dev/gpu-b (c 195:1)"},
		{"a neighbour's GPU node", withDevices("train", []*api.LinuxDevice{gpu("/dev/nvidia0", 0), gpu("/dev/nvidia1", 1)}, rule(i64(0)), rule(i64(1))), "/dev/nvidia1"},
		{"a cgroup rule for every GPU minor", withDevices("train", []*api.LinuxDevice{gpu("/dev/nvidia0", 0)}, rule(nil)), "c 195:* rwm"},
	} {
		if spec, err := finalSpec(t, r, tc.req); err == nil || !strings.Contains(err.Error(), tc.refusing) {
			var devs []string
			if spec != nil {
				for _, d := range spec.Linux.Devices {
					devs = append(devs, d.Path)
				}
			}
			t.Errorf("%s: %v (the runtime would run with %v), want refused naming %q", tc.name, err, devs, tc.refusing)
		}
	}
}

// greedy is an NRI plugin ordered after the enforcer (a higher index) that
// gives containers named greedy what the kubelet did not allocate: its
// vector's GPU device node, CDI device or device variable. The enforcer at
// creation sees none of it.
type greedy struct{ vector string }

func (g greedy) CreateContainer(_ context.Context, _ *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	switch ctr.GetName() {
	case "greedy":
	case "probe": // says it is registered
		adj := &api.ContainerAdjustment{}
		adj.AddAnnotation("greedy", "registered")
		return adj, nil, nil
	default:
		return nil, nil, nil
	}
	adj := &api.ContainerAdjustment{}
	if g.vector == "" || g.vector == "device node" {
		adj.AddDevice(&api.LinuxDevice{Path: "/dev/nvidia1", Type: "c", Major: GPUMajor, Minor: 1})
	}
	if g.vector == "" || g.vector == "CDI device" {
		adj.AddCDIDevice(&api.CDIDevice{Name: "nvidia.com/gpu=GPU-b"})
	}
	if g.vector == "" || g.vector == "device variable" {
		adj.AddEnv("NVIDIA_VISIBLE_DEVICES", "all")
	}
	return adj, nil, nil
}

// TestALaterPluginsGrantIsRefused: a plugin registered after the enforcer
// (index 95) gives a container a GPU device node, a CDI device and a device
// variable beyond its allocation, which the enforcer's CreateContainer
// never sees; through NRI's adjustment validation the container is refused,
// for each alone and all together, while a container the plugin leaves
// alone, allocated GPU-a, is created with its own GPU. Without validation
// each was created as the later plugin left it.
func TestALaterPluginsGrantIsRefused(t *testing.T) {
	for _, vector := range []string{"device node", "CDI device", "device variable", ""} {
		name := vector
		if name == "" {
			name = "all three"
		}
		t.Run(name, func(t *testing.T) {
			r, socket := startRuntime(t)
			rules := &atomic.Pointer[Rules]{}
			s, err := NewSpecDirs([]string{specDir(t, true)}, []string{"nvidia.com/gpu"})
			if err != nil {
				t.Fatal(err)
			}
			rules.Store(testRules(t).WithCDI(s))
			decisions, latency := NewMetrics(prometheus.NewRegistry())
			allocs := fixedAllocations{
				{Namespace: "team-a", Pod: "train", Container: "main"}:   {"nvidia.com/gpu": {"GPU-a"}},
				{Namespace: "team-a", Pod: "train", Container: "greedy"}: {"nvidia.com/gpu": {"GPU-a"}},
			}
			p := &Plugin{Rules: rules, Exemptions: &verifier.Exemptions{}, Log: logr.Discard(), Decisions: decisions, Latency: latency, Allocations: allocs}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); p.Run(ctx, socket, 100*time.Millisecond) }()
			t.Cleanup(func() { cancel(); <-done })
			later, err := stub.New(greedy{vector}, stub.WithPluginName("greedy"), stub.WithPluginIdx("95"), stub.WithSocketPath(socket),
				stub.WithOnClose(func() {}))
			if err != nil {
				t.Fatal(err)
			}
			if err := later.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(later.Stop)
			waitAdjusted(t, r, createRequest("warmup", "main", "NVIDIA_VISIBLE_DEVICES=all"))
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				resp, err := r.CreateContainer(context.Background(), createRequest("warmup", "probe"))
				if err != nil {
					t.Fatal(err)
				}
				if resp.GetAdjust().GetAnnotations()["greedy"] != "" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the later plugin did not register within 10s")
				}
			}
			req := createRequest("train", "greedy", "NVIDIA_VISIBLE_DEVICES=GPU-a")
			req.Container.Linux = &api.LinuxContainer{Devices: []*api.LinuxDevice{{Path: "/dev/nvidia0", Type: "c", Major: GPUMajor, Minor: 0}}}
			if spec, err := finalSpec(t, r, req); err == nil || !strings.Contains(err.Error(), "gpuguard") {
				var got []string
				if spec != nil {
					for _, d := range spec.Linux.Devices {
						got = append(got, d.Path)
					}
					got = append(got, spec.Process.Env...)
				}
				t.Errorf("the greedy container: %v (the runtime would run with %v), want refused by gpuguard", err, got)
			} else {
				t.Log(err)
			}
			beside := createRequest("train", "main", "NVIDIA_VISIBLE_DEVICES=GPU-a")
			beside.Container.Linux = &api.LinuxContainer{Devices: []*api.LinuxDevice{{Path: "/dev/nvidia0", Type: "c", Major: GPUMajor, Minor: 0}}}
			spec, err := finalSpec(t, r, beside)
			if err != nil {
				t.Fatalf("the container beside it: %v", err)
			}
			if env, _ := envMap(spec.Process.Env); len(spec.Linux.Devices) != 1 || env["NVIDIA_VISIBLE_DEVICES"] != "GPU-a" {
				t.Errorf("the container beside it runs with devices %v and env %v, want /dev/nvidia0 and GPU-a", spec.Linux.Devices, spec.Process.Env)
			}
		})
	}
}
