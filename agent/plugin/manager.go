package plugin

import (
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuguard/gpuguard/agent/strategy"
)

// ResourceManager is what the plugin server needs of one resource's devices
// (agent/rm implements it): the server translates the kubelet's gRPC calls,
// the manager decides.
type ResourceManager interface {
	// Resource is the resource name served.
	Resource() string
	// Snapshot is the device list for ListAndWatch, and a channel closed
	// when it changes.
	Snapshot() ([]*pluginapi.Device, <-chan struct{})
	// Counts are the healthy and unhealthy devices, for metrics.
	Counts() (healthy, unhealthy int)
	// SetHealth marks a physical device (by UUID) and its shares; it
	// reports whether anything changed.
	SetHealth(uuid string, healthy bool, reason string) bool
	// Has says whether the resource holds the physical device (by UUID).
	Has(uuid string) bool
	// Resolve maps a container's device IDs to the physical devices they
	// stand for, each once.
	Resolve(ids []string) ([]strategy.DeviceRef, error)
	// Preferred picks size of available, keeping mustInclude.
	Preferred(available, mustInclude []string, size int) ([]string, error)
}
