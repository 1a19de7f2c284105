package rm

import (
	"fmt"
	"sync"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuguard/gpuguard/agent/discovery"
	"github.com/gpuguard/gpuguard/agent/strategy"
)

// Manager holds the devices of one resource and their health, and wakes
// whoever waits on Snapshot when it changes. Health belongs to the physical
// device: every time-sliced share of a failed GPU fails with it. It is safe
// for concurrent use.
type Manager struct {
	resource string
	devices  []Device
	byID     map[string]int
	physical map[string]bool // Ref.UUID of every device
	shared   bool            // devices are time-sliced replicas

	mu        sync.Mutex
	unhealthy map[string]string // Ref.UUID → reason
	changed   chan struct{}
}

// New manages the devices of r.
func New(r Resource) *Manager {
	devs := r.Devices
	s := &Manager{resource: r.Name, devices: devs, byID: map[string]int{}, physical: map[string]bool{}, unhealthy: map[string]string{}, changed: make(chan struct{})}
	for i, d := range devs {
		s.byID[d.ID] = i
		s.physical[d.Ref.UUID] = true
		s.shared = s.shared || d.Replica
	}
	return s
}

// Resource is the resource name.
func (s *Manager) Resource() string { return s.resource }

// Has says whether the resource holds the physical device (by UUID), whole
// or in shares.
func (s *Manager) Has(uuid string) bool { return s.physical[uuid] }

func (s *Manager) lookup(id string) (Device, bool) {
	i, ok := s.byID[id]
	if !ok {
		return Device{}, false
	}
	return s.devices[i], true
}

// SetHealth records a physical device's health by its UUID; it reports
// whether that changed anything (unknown UUIDs change nothing).
func (s *Manager) SetHealth(id string, healthy bool, reason string) bool {
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

// Snapshot returns the device list for the kubelet and a channel closed at
// the next change.
func (s *Manager) Snapshot() ([]*pluginapi.Device, <-chan struct{}) {
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

// Counts counts the devices the kubelet sees, shares included.
func (s *Manager) Counts() (healthy, unhealthy int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range s.devices {
		if _, bad := s.unhealthy[d.Ref.UUID]; bad {
			unhealthy++
		}
	}
	return len(s.devices) - unhealthy, unhealthy
}

// Resolve maps a container's device IDs to the devices they stand for, each
// once: two shares of one GPU give the container that GPU, once. An unknown
// or repeated ID is an error.
func (s *Manager) Resolve(ids []string) ([]strategy.DeviceRef, error) {
	seen := map[string]bool{}
	physical := map[string]bool{}
	refs := make([]strategy.DeviceRef, 0, len(ids))
	for _, id := range ids {
		d, ok := s.lookup(id)
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
