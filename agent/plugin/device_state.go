package plugin

import (
	"sync"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuguard/gpuguard/agent/discovery"
)

// deviceState holds the devices of one resource and their health, and
// wakes ListAndWatch streams when it changes.
type deviceState struct {
	devices []Device
	byID    map[string]int

	mu        sync.Mutex
	unhealthy map[string]string // ID → reason
	changed   chan struct{}
}

func newDeviceState(devs []Device) *deviceState {
	s := &deviceState{devices: devs, byID: map[string]int{}, unhealthy: map[string]string{}, changed: make(chan struct{})}
	for i, d := range devs {
		s.byID[d.ID] = i
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

// setHealth records a device's health; it reports whether that changed
// anything (unknown IDs change nothing).
func (s *deviceState) setHealth(id string, healthy bool, reason string) bool {
	if _, ok := s.byID[id]; !ok {
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
		if _, bad := s.unhealthy[d.ID]; bad {
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

func (s *deviceState) counts() (healthy, unhealthy int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.devices) - len(s.unhealthy), len(s.unhealthy)
}
