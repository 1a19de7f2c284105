package app

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuguard/gpuguard/agent/nodereport"
	"github.com/gpuguard/gpuguard/internal/wellknown"
	"github.com/gpuguard/gpuguard/testsupport/kubelettest"
)

func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "gg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func testConfig(t *testing.T, dir, scenario string) Config {
	t.Helper()
	root, err := filepath.Abs("../nodereport/testdata/" + scenario)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Backend = "mock:dgxa100"
	cfg.NodeName = "node-1"
	cfg.DevicePluginDir = dir
	cfg.HostRoot = root
	cfg.ToolkitVersion = "1.17.8"
	cfg.MetricsAddr = ""
	return cfg
}

type running struct {
	agent  *Agent
	cancel context.CancelFunc
	done   chan struct{} // closed when Run returned
	err    error
	reload chan struct{}
}

// stopped waits for Run to return.
func (r *running) stopped(t *testing.T) error {
	t.Helper()
	select {
	case <-r.done:
		return r.err
	case <-time.After(15 * time.Second):
		t.Fatal("agent did not stop")
		return nil
	}
}

func waitHealthy(t *testing.T, a *Agent) {
	t.Helper()
	ctx := wait(t)
	for a.Healthy() != nil {
		select {
		case <-ctx.Done():
			t.Fatalf("agent never became healthy: %v", a.Healthy())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func run(t *testing.T, cfg Config) *running {
	t.Helper()
	a, err := New(cfg, logr.Discard(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	a.healthWait = 50 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{agent: a, cancel: cancel, done: make(chan struct{}), reload: make(chan struct{}, 1)}
	go func() {
		r.err = a.Run(ctx, r.reload)
		close(r.done)
	}()
	t.Cleanup(func() {
		cancel()
		r.stopped(t)
	})
	return r
}

func wait(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func gpuRegistrations(n int) func([]*pluginapi.RegisterRequest) bool {
	return func(regs []*pluginapi.RegisterRequest) bool {
		c := 0
		for _, r := range regs {
			if r.ResourceName == "nvidia.com/gpu" {
				c++
			}
		}
		return c >= n
	}
}

func TestAgentServesMockNodeAndSurvivesKubeletRestart(t *testing.T) {
	dir := shortDir(t)
	k, err := kubelettest.Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	r := run(t, testConfig(t, dir, "hardened"))
	regs, err := k.WaitFor(wait(t), gpuRegistrations(1))
	if err != nil {
		t.Fatal(err)
	}
	c, closeFn, err := kubelettest.Dial(dir, regs[0].Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	ctx := wait(t)
	stream, list, err := kubelettest.FirstList(ctx, c, 8)
	if err != nil {
		t.Fatal(err)
	}
	// The hardened sample node accepts volume mounts: auto picks them.
	resp, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{list.Devices[0].ID}}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.ContainerResponses[0].Mounts; len(got) != 1 || got[0].ContainerPath != "/var/run/nvidia-container-devices/"+list.Devices[0].ID {
		t.Fatalf("mounts %v", got)
	}

	// An XID from NVML reaches the kubelet.
	r.agent.Backend().Mock.Events.SendXID(r.agent.Backend().Mock.Server.Devices[1], 79)
	next, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if next.Devices[1].Health != pluginapi.Unhealthy {
		t.Fatalf("device 1 after XID 79: %v", next.Devices[1])
	}

	// The kubelet restarts: its socket goes away and comes back.
	k.Stop()
	k2, err := kubelettest.Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer k2.Stop()
	regs2, err := k2.WaitFor(wait(t), gpuRegistrations(1))
	if err != nil {
		t.Fatal(err)
	}
	if regs2[0].Endpoint != regs[0].Endpoint {
		t.Errorf("endpoint changed: %s → %s", regs[0].Endpoint, regs2[0].Endpoint)
	}
	if err := r.agent.Healthy(); err != nil {
		t.Errorf("healthy: %v", err)
	}

	// SIGHUP (reload) re-registers too.
	r.reload <- struct{}{}
	if _, err := k2.WaitFor(wait(t), gpuRegistrations(2)); err != nil {
		t.Fatal(err)
	}

	// SIGTERM: clean stop, socket removed.
	r.cancel()
	if err := r.stopped(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, regs[0].Endpoint)); !os.IsNotExist(err) {
		t.Errorf("plugin socket left after stop: %v", err)
	}
}

func TestAgentRegistersWhenKubeletComesLater(t *testing.T) {
	dir := shortDir(t)
	cfg := testConfig(t, dir, "operator-cdi")
	cfg.Backend = "mock:dgxh100:mig"
	cfg.CDISpecDir = "/tmp-own-cdi" // unused: the test writes no toolkit spec, so auto writes the own spec here
	cfg.CDIDevRoot = "/run/fake-gpus"
	cfg.HostRoot = shortDir(t)
	copyTree(t, "../nodereport/testdata/operator-cdi", cfg.HostRoot)
	run(t, cfg)
	k, err := kubelettest.Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Stop()
	regs, err := k.WaitFor(wait(t), func(regs []*pluginapi.RegisterRequest) bool { return len(regs) >= 4 })
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, reg := range regs {
		names[reg.ResourceName] = true
	}
	for _, want := range []string{"nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb"} {
		if !names[want] {
			t.Errorf("resource %s not registered (got %v)", want, names)
		}
	}
	spec, err := os.ReadFile(filepath.Join(cfg.HostRoot, "tmp-own-cdi", "gpuguard.io-gpu.yaml"))
	if err != nil {
		t.Fatalf("own CDI spec not written: %v", err)
	}
	if !strings.Contains(string(spec), "hostPath: /run/fake-gpus/dev/nvidia0") {
		t.Errorf("--cdi-dev-root did not reach the own CDI spec:\n%s", spec)
	}
}

func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.Walk(src, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		if info.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(target, data, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

type answeringPlugin struct {
	pluginapi.UnimplementedDevicePluginServer
}

func (answeringPlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// serveOtherPlugin serves a device plugin at dir/name until the returned
// stop, which also removes the socket.
func serveOtherPlugin(t *testing.T, dir, name string) (stop func()) {
	t.Helper()
	l, err := net.Listen("unix", filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(s, answeringPlugin{})
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return s.Stop
}

// waitStarts waits until the agent has completed n starts.
func waitStarts(t *testing.T, a *Agent, n int) {
	t.Helper()
	ctx := wait(t)
	for {
		a.mu.Lock()
		done := a.starts >= n
		a.mu.Unlock()
		if done {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("agent never completed %d starts", n)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func TestAgentStaysOffWhenAnotherPluginServes(t *testing.T) {
	dir := shortDir(t)
	stopOther := serveOtherPlugin(t, dir, "nvidia-gpu.sock")
	k, err := kubelettest.Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	r := run(t, testConfig(t, dir, "hardened"))
	// Registration happens within a start, so after the first start a
	// registration would already be recorded.
	waitStarts(t, r.agent, 1)
	if regs := k.Registrations(); len(regs) != 0 {
		t.Fatalf("registered although another plugin serves: %v", regs)
	}
	if got := r.agent.Serving(); len(got) != 0 {
		t.Fatalf("serving %v", got)
	}
	if _, err := os.Stat(filepath.Join(dir, "gpuguard-nvidia.com-gpu.sock")); !os.IsNotExist(err) {
		t.Fatalf("socket exists: %v", err)
	}

	// A kubelet restart wipes the other plugin's socket before that plugin
	// serves again: the agent must still stay off.
	stopOther()
	k.Stop()
	k2, err := kubelettest.Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer k2.Stop()
	waitStarts(t, r.agent, 2)
	if regs := k2.Registrations(); len(regs) != 0 {
		t.Fatalf("registered after a kubelet restart while the other plugin was away: %v", regs)
	}

	// A reload looks afresh: the other plugin is gone, so the agent serves.
	r.reload <- struct{}{}
	if _, err := k2.WaitFor(wait(t), gpuRegistrations(1)); err != nil {
		t.Fatal(err)
	}
}

func TestAgentTakesOverWithDevicePluginOn(t *testing.T) {
	dir := shortDir(t)
	serveOtherPlugin(t, dir, "nvidia-gpu.sock")
	k, err := kubelettest.Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Stop()
	cfg := testConfig(t, dir, "hardened")
	cfg.DevicePlugin = PluginOn
	run(t, cfg)
	if _, err := k.WaitFor(wait(t), gpuRegistrations(1)); err != nil {
		t.Fatal(err)
	}
}

func TestAgentServesTimeSlicedShares(t *testing.T) {
	dir := shortDir(t)
	k, err := kubelettest.Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Stop()
	cfg := testConfig(t, dir, "hardened")
	cfg.TimeSlicingReplicas, cfg.TimeSlicingRename = 3, true
	run(t, cfg)
	regs, err := k.WaitFor(wait(t), func(regs []*pluginapi.RegisterRequest) bool { return len(regs) > 0 })
	if err != nil {
		t.Fatal(err)
	}
	if regs[0].ResourceName != "nvidia.com/gpu.shared" {
		t.Fatalf("registered %s, want nvidia.com/gpu.shared", regs[0].ResourceName)
	}
	c, closeFn, err := kubelettest.Dial(dir, regs[0].Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	stream, err := c.ListAndWatch(wait(t), &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	list, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Devices) != 24 || !strings.HasSuffix(list.Devices[2].ID, "::2") {
		t.Errorf("%d devices (want 8 GPUs × 3 shares), third %q", len(list.Devices), list.Devices[2].ID)
	}
}

func TestAgentRefusesStrategyTheToolkitIgnores(t *testing.T) {
	dir := shortDir(t)
	cfg := testConfig(t, dir, "default")
	cfg.DeviceListStrategy = "volume-mounts"
	a, err := New(cfg, logr.Discard(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	err = a.Run(wait(t), nil)
	var ce ConfigError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "accept-nvidia-visible-devices-as-volume-mounts = true") {
		t.Fatalf("got %v", err)
	}
	if a.Healthy() == nil {
		t.Error("healthy after refusing to start")
	}
}

func TestBadFlags(t *testing.T) {
	for name, mutate := range map[string]func(*Config){
		"plugin mode":     func(c *Config) { c.DevicePlugin = "maybe" },
		"strategy":        func(c *Config) { c.DeviceListStrategy = "envvar,volume-mounts" },
		"id strategy":     func(c *Config) { c.DeviceIDStrategy = "serial" },
		"mig strategy":    func(c *Config) { c.MIGStrategy = "single" },
		"replicas":        func(c *Config) { c.TimeSlicingReplicas = 0 },
		"backend":         func(c *Config) { c.Backend = "mock:dgx1" },
		"retry":           func(c *Config) { c.RetryInterval = 0 },
		"verify mode":     func(c *Config) { c.Verify = "audit" },
		"verify interval": func(c *Config) { c.VerifyInterval = 10 * time.Millisecond },
		"cdi spec mode":   func(c *Config) { c.CDISpec = "mine" },
		// Enforcing evicts through the API server, which this agent has no access to.
		"verify enforce without API access": func(c *Config) { c.Verify = "enforce" },
		"reports without API access":        func(c *Config) { c.Reports = true },
	} {
		cfg := testConfig(t, "/nonexistent", "hardened")
		mutate(&cfg)
		_, err := New(cfg, logr.Discard(), prometheus.NewRegistry())
		var ce ConfigError
		if !errors.As(err, &ce) {
			t.Errorf("%s: got %v, want a ConfigError", name, err)
		}
	}
}

func TestMetricsAndHealthz(t *testing.T) {
	dir := shortDir(t)
	k, err := kubelettest.Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Stop()
	reg := prometheus.NewRegistry()
	a, err := New(testConfig(t, dir, "default"), logr.Discard(), reg)
	if err != nil {
		t.Fatal(err)
	}
	a.healthWait = 50 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, err := a.ServeHTTP(ctx, "127.0.0.1:0", reg)
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr.String() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/healthz"); code != http.StatusServiceUnavailable {
		t.Errorf("healthz before start: %d", code)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, nil) }()
	if _, err := k.WaitFor(wait(t), gpuRegistrations(1)); err != nil {
		t.Fatal(err)
	}
	waitHealthy(t, a)
	if code, body := get("/healthz"); code != http.StatusOK {
		t.Errorf("healthz: %d %s", code, body)
	}
	_, body := get("/metrics")
	for _, want := range []string{
		`gpuguard_agent_node_hardening_check{check="envvar_when_unprivileged_rejected",status="fail"} 1`,
		`gpuguard_agent_node_hardened 0`,
		`gpuguard_agent_devices{health="Healthy",resource="nvidia.com/gpu"} 8`,
		`gpuguard_agent_plugin_registered{resource="nvidia.com/gpu"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	cancel()
	<-done
}

func TestAgentPublishesNodeLabels(t *testing.T) {
	dir := shortDir(t)
	cfg := testConfig(t, dir, "default")
	cfg.DevicePlugin = PluginOff
	a, err := New(cfg, logr.Discard(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", Labels: map[string]string{"keep": "me"}}})
	a.nodeLabels = &labelPublisher{client: client, nodeName: "node-1"}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, nil) }()
	defer func() {
		cancel()
		<-done
	}()
	waitStarts(t, a, 1)
	node, err := client.CoreV1().Nodes().Get(wait(t), "node-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"keep":                      "me",
		wellknown.HardenedLabel:     "false",
		wellknown.HardenedMarkLabel: "false",
		wellknown.CheckLabelPrefix + nodereport.CheckEnvvarUnprivileged: "fail",
	}
	for k, v := range want {
		if node.Labels[k] != v {
			t.Errorf("label %s=%q, want %q (labels %v)", k, node.Labels[k], v, node.Labels)
		}
	}
}

func TestPublishNodeLabelsNeedsNodeName(t *testing.T) {
	t.Setenv("NODE_NAME", "")
	cfg := testConfig(t, shortDir(t), "hardened")
	cfg.NodeName = ""
	cfg.PublishNodeLabels = true
	_, err := New(cfg, logr.Discard(), prometheus.NewRegistry())
	var ce ConfigError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "NODE_NAME") {
		t.Fatalf("got %v, want a ConfigError asking for NODE_NAME", err)
	}
}

// TestReportOnlyWithoutKubeletDir: --device-plugin=off reports on a node whose
// kubelet has not made its device plugin directory (found on a real GPU
// machine, where the agent exited instead).
func TestReportOnlyWithoutKubeletDir(t *testing.T) {
	cfg := testConfig(t, filepath.Join(shortDir(t), "absent"), "default")
	cfg.DevicePlugin = PluginOff
	r := run(t, cfg)
	waitStarts(t, r.agent, 1)
	select {
	case <-r.done:
		t.Fatalf("the agent stopped: %v", r.err)
	default:
	}
	if err := r.agent.Healthy(); err != nil {
		t.Errorf("report-only agent unhealthy: %v", err)
	}
}

// TestVerifierKeepsTheLastGoodPolicy: a policy file that is missing, has a
// typo or a newer gpuguard's field never stops the agent; the verifier keeps
// the last policy it could read, the built-in one before any.
func TestVerifierKeepsTheLastGoodPolicy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	cfg := testConfig(t, "/nonexistent", "hardened")
	cfg.PolicyFile = path
	a, err := New(cfg, logr.Discard(), prometheus.NewRegistry())
	if err != nil {
		t.Fatalf("a missing policy file stopped the agent: %v", err)
	}
	if p := a.verifierPolicy(); !p.Spec.IsGPUResource("nvidia.com/gpu") {
		t.Error("before any policy file, the built-in policy applies")
	}
	good := "apiVersion: gpuguard.io/v1alpha1\nkind: GPUGuardPolicy\nspec:\n  gpuResources: [example.com/gpu]\n"
	if err := os.WriteFile(path, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	if p := a.verifierPolicy(); !p.Spec.IsGPUResource("example.com/gpu") {
		t.Error("the policy file's gpuResources do not apply")
	}
	if err := os.WriteFile(path, []byte(good+"  fieldOfANewerRelease: true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if p := a.verifierPolicy(); !p.Spec.IsGPUResource("example.com/gpu") || p.Spec.IsGPUResource("nvidia.com/gpu") {
		t.Error("an unreadable policy did not leave the last good one in force")
	}
}
