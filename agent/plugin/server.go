// Package plugin is the kubelet device plugin server: one gRPC server per
// resource on a unix socket in the device plugin directory, which registers
// with the kubelet and answers it through a ResourceManager.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
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
	// Devices are the resource's devices and their health.
	Devices ResourceManager
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
	devices  ResourceManager

	mu     sync.Mutex
	server *grpc.Server
	done   chan struct{}
}

// New prepares a plugin; Start serves it.
func New(o Options) *Plugin {
	name := o.Devices.Resource()
	p := &Plugin{
		resource: name,
		dir:      o.Dir,
		socket:   filepath.Join(o.Dir, SocketName(name)),
		builder:  o.Builder,
		log:      o.Log.WithValues("resource", name),
		metrics:  o.Metrics,
		devices:  o.Devices,
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
	healthy, unhealthy := p.devices.Counts()
	p.log.Info("serving device plugin", "socket", p.socket, "devices", healthy+unhealthy)
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
	if p.devices.SetHealth(id, healthy, reason) {
		p.log.Info("device health changed", "device", id, "healthy", healthy, "reason", reason)
		p.updateDeviceMetrics()
	}
}

// Has says whether the plugin serves the physical device (by UUID), whole
// or in shares.
func (p *Plugin) Has(uuid string) bool { return p.devices.Has(uuid) }

func (p *Plugin) updateDeviceMetrics() {
	if p.metrics == nil {
		return
	}
	h, u := p.devices.Counts()
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
		devs, changed := p.devices.Snapshot()
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
		ids, err := p.devices.Preferred(cr.GetAvailableDeviceIDs(), cr.GetMustIncludeDeviceIDs(), int(cr.GetAllocationSize()))
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
		refs, err := p.devices.Resolve(cr.GetDevicesIds())
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

// SocketName is the plugin's socket for a resource in the plugin dir.
func SocketName(resource string) string {
	return "gpuguard-" + strings.NewReplacer("/", "-", "+", ".").Replace(resource) + ".sock"
}
