// Package kubelettest is a stand-in for the kubelet's device manager: a
// Registration gRPC server on kubelet.sock in a directory, recording what
// device plugins register, and a client for their sockets.
package kubelettest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// SocketName is the kubelet's registration socket.
const SocketName = "kubelet.sock"

// Kubelet serves the Registration service on Dir/kubelet.sock.
type Kubelet struct {
	pluginapi.UnimplementedRegistrationServer
	Dir    string
	Socket string

	srv *grpc.Server

	mu      sync.Mutex
	regs    []*pluginapi.RegisterRequest
	changed chan struct{}
}

// Start listens on dir/kubelet.sock.
func Start(dir string) (*Kubelet, error) {
	k := &Kubelet{Dir: dir, Socket: filepath.Join(dir, SocketName), changed: make(chan struct{})}
	_ = os.Remove(k.Socket)
	l, err := net.Listen("unix", k.Socket)
	if err != nil {
		return nil, err
	}
	k.srv = grpc.NewServer()
	pluginapi.RegisterRegistrationServer(k.srv, k)
	go func() { _ = k.srv.Serve(l) }()
	return k, nil
}

// Stop stops serving and removes the socket, as a kubelet going down does.
func (k *Kubelet) Stop() {
	k.srv.Stop()
	_ = os.Remove(k.Socket)
}

// Register checks the request like the kubelet does: the API version, a
// resource name, and an endpoint socket in Dir that answers.
func (k *Kubelet) Register(ctx context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	if r.Version != pluginapi.Version {
		return nil, status.Errorf(codes.InvalidArgument, "unsupported version %q", r.Version)
	}
	if r.ResourceName == "" || r.Endpoint == "" || filepath.Base(r.Endpoint) != r.Endpoint {
		return nil, status.Errorf(codes.InvalidArgument, "bad request %v", r)
	}
	c, closeFn, err := Dial(k.Dir, r.Endpoint)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "dialing plugin: %v", err)
	}
	defer closeFn()
	if _, err := c.GetDevicePluginOptions(ctx, &pluginapi.Empty{}); err != nil {
		return nil, status.Errorf(codes.Unavailable, "plugin does not answer: %v", err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.regs = append(k.regs, r)
	close(k.changed)
	k.changed = make(chan struct{})
	return &pluginapi.Empty{}, nil
}

// Registrations returns every registration so far.
func (k *Kubelet) Registrations() []*pluginapi.RegisterRequest {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]*pluginapi.RegisterRequest(nil), k.regs...)
}

// WaitFor waits until cond holds for the registrations, or ctx ends.
func (k *Kubelet) WaitFor(ctx context.Context, cond func([]*pluginapi.RegisterRequest) bool) ([]*pluginapi.RegisterRequest, error) {
	for {
		k.mu.Lock()
		regs := append([]*pluginapi.RegisterRequest(nil), k.regs...)
		ch := k.changed
		k.mu.Unlock()
		if cond(regs) {
			return regs, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return regs, fmt.Errorf("waiting for registrations (have %d): %w", len(regs), ctx.Err())
		}
	}
}

// Dial connects to a plugin socket in dir.
func Dial(dir, endpoint string) (pluginapi.DevicePluginClient, func(), error) {
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	return pluginapi.NewDevicePluginClient(conn), func() { _ = conn.Close() }, nil
}

// FirstList opens ListAndWatch as the kubelet does and returns the stream with the
// initial device list, failing when it does not hold want devices.
func FirstList(ctx context.Context, c pluginapi.DevicePluginClient, want int) (pluginapi.DevicePlugin_ListAndWatchClient, *pluginapi.ListAndWatchResponse, error) {
	stream, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		return nil, nil, err
	}
	list, err := stream.Recv()
	if err != nil {
		return nil, nil, err
	}
	if len(list.Devices) != want {
		return nil, nil, fmt.Errorf("%d devices, want %d", len(list.Devices), want)
	}
	return stream, list, nil
}
