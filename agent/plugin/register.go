package plugin

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Register announces the plugin to the kubelet's registration socket.
func (p *Plugin) Register(ctx context.Context, kubeletSocket string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+kubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("connecting to the kubelet at %s: %w", kubeletSocket, err)
	}
	defer conn.Close()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     p.Endpoint(),
		ResourceName: p.resource,
		Options:      &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
	})
	if err != nil {
		return fmt.Errorf("registering %s with the kubelet at %s: %w", p.resource, kubeletSocket, err)
	}
	if p.metrics != nil {
		p.metrics.registered.WithLabelValues(p.resource).Set(1)
	}
	p.log.Info("registered with the kubelet", "kubeletSocket", kubeletSocket, "endpoint", p.Endpoint())
	return nil
}
