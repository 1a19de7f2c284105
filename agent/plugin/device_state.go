package plugin

import (
	"sync"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuguard/gpuguard/agent/discovery"
)

// deviceState holds the devices of one resource and their health, and
// wakes ListAndWatch streams when it changes. Health belongs to the
// physical device: every time-sliced share of a failed GPU fails with it.
type deviceState struct {
	devices  []Device
	byID     map[string]int
	physical map[string]bool // Ref.UUID of every device
	shared   bool            // devices are time-sliced replicas

	mu        sync.Mutex
	unhealthy map[string]string // Ref.UUID → reason
	changed   chan struct{}
}

func newDeviceState(devs []Device) *deviceState {
	s := &deviceState{devices: devs, byID: map[string]int{}, physical: map[string]bool{}, unhealthy: map[string]string{}, changed: make(chan struct{})}
	for i, d := range devs {
		s.byID[d.ID] = i
		s.physical[d.Ref.UUID] = true
		s.shared = s.shared || d.Replica
	}
	return s
}

func (s *deviceState) lookup(id string) (Device, bool) {
	i, ok := s.byID[id]
	if !ok {
		return Device{}, false
	}
	return s.devices[i], true
}

// setHealth records a physical device's health by its UUID; it reports
// whether that changed anything (unknown UUIDs change nothing).
func (s *deviceState) setHealth(id string, healthy bool, reason string) bool {
	if !s.physical[id] {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, wasUnhealthy := s.unhealthy[id]
	if healthy == !wasUnhealthy {
		return false
	}
	if healthy {
		delete(s.unhealthy, id)
	} else {
		s.unhealthy[id] = reason
	}
	close(s.changed)
	s.changed = make(chan struct{})
	return true
}

// snapshot returns the device list for the kubelet and a channel closed at
// the next change.
func (s *deviceState) snapshot() ([]*pluginapi.Device, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*pluginapi.Device, len(s.devices))
	for i, d := range s.devices {
		health := pluginapi.Healthy
		if _, bad := s.unhealthy[d.Ref.UUID]; bad {
			health = pluginapi.Unhealthy
		}
		pd := &pluginapi.Device{ID: d.ID, Health: health}
		if d.NUMANode != discovery.UnknownNUMANode {
			pd.Topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(d.NUMANode)}}}
		}
		out[i] = pd
	}
	return out, s.changed
}

// counts counts the devices the kubelet sees, shares included.
func (s *deviceState) counts() (healthy, unhealthy int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range s.devices {
		if _, bad := s.unhealthy[d.Ref.UUID]; bad {
			unhealthy++
		}
	}
	return len(s.devices) - unhealthy, unhealthy
}
