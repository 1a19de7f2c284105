package app

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuguard/gpuguard/agent/cdispec"
	"github.com/gpuguard/gpuguard/agent/discovery"
	"github.com/gpuguard/gpuguard/agent/enforcer"
	"github.com/gpuguard/gpuguard/agent/health"
	"github.com/gpuguard/gpuguard/agent/nodereport"
	"github.com/gpuguard/gpuguard/agent/plugin"
	"github.com/gpuguard/gpuguard/agent/rm"
	"github.com/gpuguard/gpuguard/agent/strategy"
	"github.com/gpuguard/gpuguard/agent/verifier"
	"github.com/gpuguard/gpuguard/config"
)

// ConfigError is a configuration the agent refuses to run with.
type ConfigError struct{ Err error }

func (e ConfigError) Error() string { return e.Err.Error() }
func (e ConfigError) Unwrap() error { return e.Err }

// Agent runs the node agent.
type Agent struct {
	cfg     Config
	set     settings
	log     logr.Logger
	backend *discovery.Backend

	pluginMetrics *plugin.Metrics
	hardening     *nodereport.Metrics
	xids          *prometheus.CounterVec
	otherPlugin   prometheus.Gauge
	// healthWait bounds one NVML event wait (0: the watcher default).
	healthWait time.Duration
	// nodeLabels publishes the hardening report; nil unless
	// --publish-node-labels.
	nodeLabels *labelPublisher
	// assessed is what the last hardening assessment found and wrote.
	assessed assessment
	// enforcerRequired: the last assessment found containerd refusing
	// containers while the node enforcer is not connected. The enforcer's
	// Lease, which lets admission count the node as covered, is held only
	// then.
	enforcerRequired atomic.Bool
	// kube records the verifier's Events and evictions; nil without API access.
	kube kubernetes.Interface
	// unqueued makes the calls a container's creation waits on (the
	// enforcer's reads of pods) and the Leases that keep the node counted
	// as covered; nil without API access. See apiClients.
	unqueued kubernetes.Interface
	// lastPolicy is the last policy the verifier could read; policyErr the
	// last problem with the file, logged once.
	policyMu   sync.Mutex
	lastPolicy *config.Policy
	policyErr  string
	// reports writes the node's ClusterReport; nil unless --reports.
	reports       dynamic.Interface
	verifyMetrics *verifier.Metrics
	// enforceDecisions and enforceLatency are the node enforcer's metrics.
	enforceDecisions *prometheus.CounterVec
	enforceLatency   prometheus.Observer
	enforceReads     *prometheus.CounterVec
	// enforceValidations and enforceValidationLatency are its adjustment
	// validations'.
	enforceValidations       *prometheus.CounterVec
	enforceValidationLatency prometheus.Histogram

	// otherPlugins are the sockets of another NVIDIA device plugin once
	// seen in --device-plugin=auto. The agent remembers them because a
	// restarting kubelet wipes every plugin socket: looking again then
	// could catch the other plugin before it serves again, and registering
	// would start the fight the check exists to prevent. A reload looks
	// afresh. Only Run's goroutine touches it.
	otherPlugins []string

	mu      sync.Mutex
	status  error // nil when the last start succeeded
	serving []*plugin.Plugin
	starts  int // completed starts, successful or not
}

// New opens the backend; it does not start anything.
func New(cfg Config, log logr.Logger, reg prometheus.Registerer) (*Agent, error) {
	if cfg.NodeName == "" {
		cfg.NodeName = os.Getenv("NODE_NAME")
	}
	// Labels need the name the API server knows the node by: not the host
	// name fallback, which could label another node, or none.
	labelNode := cfg.NodeName
	if cfg.NodeName == "" {
		cfg.NodeName, _ = os.Hostname()
	}
	set, err := cfg.parse()
	if err != nil {
		return nil, ConfigError{err}
	}
	var nodeLabels *labelPublisher
	if cfg.PublishNodeLabels {
		p, err := newInClusterLabelPublisher(labelNode)
		if err != nil {
			return nil, ConfigError{err}
		}
		nodeLabels = p
	}
	kube, unqueued, reports, err := apiClients(cfg)
	if err != nil {
		return nil, ConfigError{err}
	}
	b, err := discovery.OpenBackend(cfg.Backend, cfg.NodeName, cfg.NVMLLibrary)
	if err != nil {
		return nil, ConfigError{err}
	}
	a := &Agent{cfg: cfg, set: set, log: log, backend: b, nodeLabels: nodeLabels, kube: kube, unqueued: unqueued, reports: reports,
		verifyMetrics: verifier.NewMetrics(reg),
		pluginMetrics: plugin.NewMetrics(reg),
		hardening:     nodereport.NewMetrics(reg),
		xids:          health.NewXIDCounter(reg),
		otherPlugin: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpuguard_agent_other_device_plugin",
			Help: "1 when another device plugin serves NVIDIA GPUs on this node, so the agent does not register.",
		}),
		status: errors.New("starting"),
	}
	reg.MustRegister(a.otherPlugin)
	a.enforceDecisions, a.enforceLatency = enforcer.NewMetrics(reg)
	a.enforceReads = enforcer.NewReadMetrics(reg)
	a.enforceValidations, a.enforceValidationLatency = enforcer.NewValidationMetrics(reg)
	return a, nil
}

// Healthy is nil while the agent runs as configured.
func (a *Agent) Healthy() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.status
}

func (a *Agent) setStatus(err error, serving []*plugin.Plugin) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.status = err
	a.serving = serving
	a.starts++
}

// Run serves until ctx ends. reload (SIGHUP) restarts with a fresh look at
// the node; a re-created kubelet.sock restarts and re-registers. It returns
// a ConfigError when the node's configuration rules out the chosen
// strategy, or when NVML cannot be loaded.
func (a *Agent) Run(ctx context.Context, reload <-chan struct{}) error {
	if err := discovery.Init(a.backend.Lib); err != nil {
		return ConfigError{err}
	}
	defer a.backend.Lib.Shutdown()
	// Reporting only, the agent has no business with the kubelet's device
	// plugin directory, which a node without a kubelet yet may lack.
	var kubeletCreated <-chan struct{}
	if a.cfg.DevicePlugin != PluginOff {
		var err error
		if kubeletCreated, err = watchKubeletSocket(ctx, a.cfg.DevicePluginDir, a.log); err != nil {
			return err
		}
	}
	if l := a.agentLease(); l != nil {
		held := make(chan struct{})
		go func() { defer close(held); l.Hold(ctx) }()
		defer func() { <-held }() // released before Run returns
	}
	refreshed := make(chan struct{})
	go func() { defer close(refreshed); a.refreshHardening(ctx) }()
	defer func() { <-refreshed }()
	retry := a.cfg.RetryInterval
	for {
		s, err := a.start(ctx)
		var cfgErr ConfigError
		if errors.As(err, &cfgErr) {
			a.setStatus(err, nil)
			return err
		}
		var retryC <-chan time.Time
		if err != nil {
			a.log.Error(err, "start failed; retrying", "after", retry.String())
			a.setStatus(err, nil)
			retryC = time.After(retry)
		} else {
			a.setStatus(nil, s.plugins)
			if s.registerFailed {
				retryC = time.After(retry)
			}
		}
		select {
		case <-ctx.Done():
			s.stop()
			a.log.Info("stopped")
			return nil
		case <-kubeletCreated:
			a.log.Info("kubelet.sock created: the kubelet restarted; serving and registering again")
		case <-reload:
			a.log.Info("reloading the configuration")
			a.otherPlugins = nil
		case <-retryC:
			a.log.Info("retrying")
		}
		s.stop()
	}
}

// session is one start of the plugins.
type session struct {
	plugins        []*plugin.Plugin
	cancel         context.CancelFunc
	wg             sync.WaitGroup
	registerFailed bool
}

func (s *session) stop() {
	if s == nil {
		return
	}
	s.cancel()
	s.wg.Wait()
	for _, p := range s.plugins {
		p.Stop()
	}
}

func (a *Agent) locator() nodereport.Locator {
	return nodereport.Locator{HostRoot: a.cfg.HostRoot, ToolkitConfig: a.cfg.ToolkitConfig, ContainerdConfig: a.cfg.ContainerdConfig}
}

// start is one start of the agent: discover the GPUs, report the node's
// hardening, start the verifier, then, unless another plugin serves the
// GPUs, prepare the resources, serve and register them, and watch health.
func (a *Agent) start(ctx context.Context) (*session, error) {
	inv, err := a.discover()
	if err != nil {
		return nil, err
	}
	in := a.reportHardening(ctx, true)
	s := &session{}
	sctx, cancel := context.WithCancel(ctx)
	s.cancel = cancel
	a.startVerifier(sctx, s, inv)
	if err := a.startEnforcer(sctx, s, inv, in); err != nil {
		cancel()
		s.wg.Wait()
		return nil, err
	}
	if !a.shouldServe(ctx) {
		return s, nil
	}
	resources, b, err := a.prepareResources(inv, in)
	if err != nil {
		cancel()
		return nil, err
	}
	if err := a.servePlugins(ctx, s, resources, b); err != nil {
		return nil, err
	}
	a.watchHealth(sctx, s, inv)
	return s, nil
}

// discover finds the node's GPUs and MIG devices.
func (a *Agent) discover() (*discovery.Inventory, error) {
	inv, err := discovery.Discover(a.backend.Lib, discovery.Options{SysfsRoot: filepath.Join(a.cfg.HostRoot, "sys")})
	if err != nil {
		return nil, fmt.Errorf("discovering GPUs: %w", err)
	}
	a.log.Info("discovered GPUs", "backend", a.backend.Name, "summary", inv.Summary(), "driver", inv.DriverVersion, "cuda", inv.CUDADriverVersion)
	for _, g := range inv.GPUs {
		a.log.V(1).Info("GPU", "index", g.Index, "uuid", g.UUID, "name", g.Name, "memoryBytes", g.MemoryBytes, "pciBusID", g.PCIBusID, "minor", g.Minor, "numa", g.NUMANode, "mig", g.MIGEnabled)
		for _, m := range g.MIG {
			a.log.V(1).Info("MIG device", "index", m.IndexID(), "uuid", m.UUID, "profile", m.Profile)
		}
	}
	return inv, nil
}

// shouldServe says whether the device plugin serves: not when turned off,
// nor in auto mode while another NVIDIA device plugin serves the node.
func (a *Agent) shouldServe(ctx context.Context) bool {
	switch a.cfg.DevicePlugin {
	case PluginOff:
		a.log.Info("device plugin off (--device-plugin=off): reporting only")
		return false
	case PluginAuto:
		if a.otherPlugins == nil {
			a.otherPlugins = plugin.FindOtherPlugins(ctx, a.cfg.DevicePluginDir)
		}
		if len(a.otherPlugins) > 0 {
			a.otherPlugin.Set(1)
			a.log.Info("another device plugin serves NVIDIA GPUs on this node; not registering, to avoid both fighting over the resource (after removing it, send SIGHUP or restart the agent; or pass --device-plugin=on)", "sockets", a.otherPlugins)
			return false
		}
		a.otherPlugin.Set(0)
	}
	return true
}

// prepareResources chooses the device-list strategy for this node, groups
// the devices into resources (MIG profiles, time-sliced shares) and makes
// sure a CDI spec names them where a CDI strategy is used. A node that rules
// out the configuration is a ConfigError.
func (a *Agent) prepareResources(inv *discovery.Inventory, in nodereport.Inputs) ([]rm.Resource, *strategy.Builder, error) {
	choice, err := strategy.Resolve(a.cfg.DeviceListStrategy, in.Toolkit, in.Containerd)
	if err != nil {
		return nil, nil, ConfigError{err}
	}
	if choice.Warning != "" {
		a.log.Info("WARNING: "+choice.Warning, "strategy", choice.List.String())
	}
	a.log.Info("device list strategy", "strategy", choice.List.String(), "reason", choice.Reason)
	b := &strategy.Builder{Strategies: choice.List, IDs: a.set.ids, AnnotationPrefix: a.cfg.CDIAnnotationPrefix}
	resources, err := rm.BuildResources(inv, a.cfg.MIGStrategy)
	if err != nil {
		return nil, nil, ConfigError{err}
	}
	if choice.List.UsesCDI() {
		if b.CDIKind, err = a.ensureCDISpec(inv, in, resources); err != nil {
			return nil, nil, ConfigError{err}
		}
	}
	// Shared after the CDI spec is written: shares name no devices of their own.
	if resources, err = a.set.timeSlicing.Apply(resources); err != nil {
		return nil, nil, ConfigError{err}
	}
	if len(resources) == 0 {
		a.log.Info("no devices found; waiting")
	}
	return resources, b, nil
}

// ensureCDISpec makes sure a CDI spec names every device, the toolkit's or
// the agent's own, and returns its kind.
func (a *Agent) ensureCDISpec(inv *discovery.Inventory, in nodereport.Inputs, resources []rm.Resource) (string, error) {
	var names []string
	for _, r := range resources {
		for _, d := range r.Devices {
			if a.set.ids == strategy.IDIndex {
				names = append(names, d.Ref.Index)
			} else {
				names = append(names, d.Ref.UUID)
			}
		}
	}
	cfg := cdispec.Config{Mode: a.cfg.CDISpec, WriteDir: filepath.Join(a.cfg.HostRoot, a.cfg.CDISpecDir), DevRoot: a.cfg.CDIDevRoot}
	if in.Toolkit != nil {
		cfg.ToolkitKind = in.Toolkit.CDIDefaultKind
		for _, d := range in.Toolkit.CDISpecDirs {
			cfg.SpecDirs = append(cfg.SpecDirs, filepath.Join(a.cfg.HostRoot, d))
		}
	} else {
		cfg.SpecDirs = []string{filepath.Join(a.cfg.HostRoot, "/etc/cdi"), filepath.Join(a.cfg.HostRoot, "/var/run/cdi")}
	}
	res, err := cdispec.Ensure(cfg, inv, names)
	if err != nil {
		return "", err
	}
	a.log.Info("CDI spec", "source", res.Source, "kind", res.Kind, "path", res.Path, "missingFromToolkitSpec", len(res.Missing))
	return res.Kind, nil
}

// servePlugins serves each resource on its socket and registers it with the
// kubelet; a failed registration is retried later.
func (a *Agent) servePlugins(ctx context.Context, s *session, resources []rm.Resource, b *strategy.Builder) error {
	kubeletSocket := filepath.Join(a.cfg.DevicePluginDir, plugin.KubeletSocketName)
	for _, r := range resources {
		p := plugin.New(plugin.Options{Devices: rm.New(r), Dir: a.cfg.DevicePluginDir, Builder: b, Log: a.log, Metrics: a.pluginMetrics})
		if err := p.Start(); err != nil {
			s.stop()
			return err
		}
		s.plugins = append(s.plugins, p)
		if err := p.Register(ctx, kubeletSocket); err != nil {
			a.log.Error(err, "registration failed; waiting for the kubelet")
			s.registerFailed = true
		}
	}
	return nil
}

// watchHealth marks devices unhealthy on XID errors, for as long as the
// session runs.
func (a *Agent) watchHealth(ctx context.Context, s *session, inv *discovery.Inventory) {
	if !a.cfg.HealthChecks || len(s.plugins) == 0 {
		return
	}
	w := &health.Watcher{
		Lib: a.backend.Lib, Inventory: inv, Ignored: a.set.ignoredXIDs, Log: a.log.WithName("health"), XIDs: a.xids,
		WaitTimeout: a.healthWait,
		Update: func(u health.Update) {
			for _, p := range s.plugins {
				if p.Has(u.ID) {
					p.SetHealth(u.ID, u.Healthy, u.Reason)
				}
			}
		},
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := w.Run(ctx); err != nil {
			a.log.Error(err, "health checks unavailable; devices stay healthy")
		}
	}()
}
