package plugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuguard/gpuguard/agent/strategy"
)

// Options configure one plugin.
type Options struct {
	Resource Resource
	// Dir is the kubelet's device plugin directory.
	Dir     string
	Builder *strategy.Builder
	Log     logr.Logger
	Metrics *Metrics // optional
}

// Plugin serves one resource to the kubelet.
type Plugin struct {
	pluginapi.UnimplementedDevicePluginServer

	resource string
	dir      string
	socket   string
	builder  *strategy.Builder
	log      logr.Logger
	metrics  *Metrics
	state    *deviceState

	mu     sync.Mutex
	server *grpc.Server
	done   chan struct{}
}

// New prepares a plugin; Start serves it.
func New(o Options) *Plugin {
	p := &Plugin{
		resource: o.Resource.Name,
		dir:      o.Dir,
		socket:   filepath.Join(o.Dir, SocketName(o.Resource.Name)),
		builder:  o.Builder,
		log:      o.Log.WithValues("resource", o.Resource.Name),
		metrics:  o.Metrics,
		state:    newDeviceState(o.Resource.Devices),
	}
	p.updateDeviceMetrics()
	return p
}

// Resource is the resource name served.
func (p *Plugin) Resource() string { return p.resource }

// Endpoint is the socket's name in the plugin dir.
func (p *Plugin) Endpoint() string { return filepath.Base(p.socket) }

// Socket is the socket's path.
func (p *Plugin) Socket() string { return p.socket }

// Start listens on the plugin socket (replacing a stale one) and serves.
func (p *Plugin) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.server != nil {
		return errors.New("plugin already started")
	}
	if err := os.Remove(p.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing stale socket: %w", err)
	}
	l, err := net.Listen("unix", p.socket)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", p.socket, err)
	}
	p.server = grpc.NewServer()
	p.done = make(chan struct{})
	pluginapi.RegisterDevicePluginServer(p.server, p)
	srv := p.server
	go func() {
		if err := srv.Serve(l); err != nil {
			p.log.Error(err, "device plugin server stopped")
		}
	}()
	p.log.Info("serving device plugin", "socket", p.socket, "devices", len(p.state.devices))
	return nil
}

// Stop ends the streams, stops the server and removes the socket.
func (p *Plugin) Stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.server == nil {
		return
	}
	close(p.done)
	p.server.Stop()
	p.server = nil
	if err := os.Remove(p.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		p.log.Error(err, "removing socket")
	}
	if p.metrics != nil {
		p.metrics.registered.WithLabelValues(p.resource).Set(0)
	}
	p.log.Info("stopped device plugin")
}

// SetHealth marks a physical device (by UUID) and all its shares healthy
// or not; ListAndWatch streams get the new list. Unknown UUIDs are ignored
// (the device is another resource's).
func (p *Plugin) SetHealth(id string, healthy bool, reason string) {
	if p.state.setHealth(id, healthy, reason) {
		p.log.Info("device health changed", "device", id, "healthy", healthy, "reason", reason)
		p.updateDeviceMetrics()
	}
}

// Has says whether the plugin serves the physical device (by UUID), whole
// or in shares.
func (p *Plugin) Has(uuid string) bool { return p.state.physical[uuid] }

func (p *Plugin) updateDeviceMetrics() {
	if p.metrics == nil {
		return
	}
	h, u := p.state.counts()
	p.metrics.devices.WithLabelValues(p.resource, pluginapi.Healthy).Set(float64(h))
	p.metrics.devices.WithLabelValues(p.resource, pluginapi.Unhealthy).Set(float64(u))
}

// GetDevicePluginOptions: no PreStartContainer needed, preferred
// allocations offered.
func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

// ListAndWatch sends the device list, then a new one at each health change.
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	for {
		devs, changed := p.state.snapshot()
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
			return err
		}
		select {
		case <-changed:
		case <-stream.Context().Done():
			return nil
		case <-done:
			return nil
		}
	}
}

// PreStartContainer is not required; it answers empty.
func (p *Plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// GetPreferredAllocation keeps each container's devices close together.
func (p *Plugin) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	// Getters, not fields: a request built in Go may hold nil entries.
	if len(req.GetContainerRequests()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "no container requests")
	}
	resp := &pluginapi.PreferredAllocationResponse{}
	for i, cr := range req.GetContainerRequests() {
		ids, err := preferredAllocation(p.state, cr.GetAvailableDeviceIDs(), cr.GetMustIncludeDeviceIDs(), int(cr.GetAllocationSize()))
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "%s container request %d: %v", p.resource, i, err)
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// Allocate answers with what the container needs to reach its devices,
// through the configured device-list strategies.
func (p *Plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp, err := p.allocate(req)
	if p.metrics != nil {
		result := "ok"
		if err != nil {
			result = "rejected"
		}
		p.metrics.allocations.WithLabelValues(p.resource, result).Inc()
	}
	if err != nil {
		p.log.Info("allocation rejected", "error", err.Error())
	}
	return resp, err
}

func (p *Plugin) allocate(req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	if len(req.GetContainerRequests()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "no container requests")
	}
	resp := &pluginapi.AllocateResponse{}
	for i, cr := range req.GetContainerRequests() {
		if len(cr.GetDevicesIds()) == 0 {
			return nil, status.Errorf(codes.InvalidArgument, "%s container request %d: no devices", p.resource, i)
		}
		refs, err := p.physicalDevices(cr.GetDevicesIds())
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "%s container request %d: %v", p.resource, i, err)
		}
		cresp, err := p.builder.Build(refs)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "%s container request %d: %v", p.resource, i, err)
		}
		resp.ContainerResponses = append(resp.ContainerResponses, cresp)
	}
	return resp, nil
}

// physicalDevices maps a container's device IDs to the devices they stand
// for, each once: two shares of one GPU give the container that GPU, once.
func (p *Plugin) physicalDevices(ids []string) ([]strategy.DeviceRef, error) {
	seen := map[string]bool{}
	physical := map[string]bool{}
	refs := make([]strategy.DeviceRef, 0, len(ids))
	for _, id := range ids {
		d, ok := p.state.lookup(id)
		if !ok {
			return nil, fmt.Errorf("unknown device %q", id)
		}
		if seen[id] {
			return nil, fmt.Errorf("device %q listed twice", id)
		}
		seen[id] = true
		if !physical[d.Ref.UUID] {
			physical[d.Ref.UUID] = true
			refs = append(refs, d.Ref)
		}
	}
	return refs, nil
}
