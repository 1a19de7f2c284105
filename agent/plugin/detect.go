package plugin

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// KubeletSocketName is the kubelet's registration socket in the plugin dir.
const KubeletSocketName = "kubelet.sock"

// FindOtherPlugins lists live device plugin sockets in dir that likely
// serve NVIDIA resources: sockets other than the kubelet's and gpuguard's
// whose name mentions nvidia and that answer GetDevicePluginOptions.
// NVIDIA's device plugin listens on nvidia-gpu.sock (nvidia.sock in old
// releases, nvidia-mig-<profile>.sock for MIG). The device plugin API does
// not say which resource a socket serves, so the name is the only hint.
func FindOtherPlugins(ctx context.Context, dir string) []string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var found []string
	for _, e := range entries {
		name := e.Name()
		if e.Type()&os.ModeSocket == 0 || name == KubeletSocketName || strings.HasPrefix(name, "gpuguard-") {
			continue
		}
		if !strings.Contains(strings.ToLower(name), "nvidia") {
			continue
		}
		if answers(ctx, filepath.Join(dir, name)) {
			found = append(found, name)
		}
	}
	sort.Strings(found)
	return found
}

func answers(ctx context.Context, socket string) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return false
	}
	defer conn.Close()
	_, err = pluginapi.NewDevicePluginClient(conn).GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	return err == nil
}
