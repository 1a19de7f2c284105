package discovery

import (
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// MockEvents stands in for NVML's event sets on a mock node. go-nvml's mock
// servers have none; the agent's health watcher needs one. Tests deliver
// XIDs and wait failures through it.
type MockEvents struct {
	queue chan mockEvent

	mu         sync.Mutex
	registered map[nvml.Device]uint64
	changed    chan struct{}
}

type mockEvent struct {
	data nvml.EventData
	ret  nvml.Return
}

// NewMockEvents returns an event source with an empty queue.
func NewMockEvents() *MockEvents {
	return &MockEvents{
		queue:      make(chan mockEvent, 64),
		registered: map[nvml.Device]uint64{},
		changed:    make(chan struct{}),
	}
}

// SendXID queues an XID critical error event for dev (a full GPU).
func (e *MockEvents) SendXID(dev nvml.Device, xid uint64) {
	e.SendXIDOnInstance(dev, xid, 0xFFFFFFFF, 0xFFFFFFFF)
}

// SendXIDOnInstance queues an XID event for a GPU and compute instance of dev.
func (e *MockEvents) SendXIDOnInstance(dev nvml.Device, xid uint64, gi, ci uint32) {
	e.queue <- mockEvent{data: nvml.EventData{
		Device:            dev,
		EventType:         nvml.EventTypeXidCriticalError,
		EventData:         xid,
		GpuInstanceId:     gi,
		ComputeInstanceId: ci,
	}, ret: nvml.SUCCESS}
}

// FailWait makes a following Wait return ret (not a timeout).
func (e *MockEvents) FailWait(ret nvml.Return) {
	e.queue <- mockEvent{ret: ret}
}

// Registered returns the event mask registered for dev, 0 if none.
func (e *MockEvents) Registered(dev nvml.Device) uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.registered[dev]
}

// RegistrationChanged is closed at the next event registration.
func (e *MockEvents) RegistrationChanged() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.changed
}

type mockEventSet struct {
	mock.EventSet
	src *MockEvents
}

func (e *MockEvents) create() (nvml.EventSet, nvml.Return) {
	s := &mockEventSet{src: e}
	s.WaitFunc = s.wait
	s.FreeFunc = func() nvml.Return { return nvml.SUCCESS }
	return s, nvml.SUCCESS
}

func (s *mockEventSet) register(dev nvml.Device, mask uint64) {
	s.src.mu.Lock()
	defer s.src.mu.Unlock()
	s.src.registered[dev] |= mask
	close(s.src.changed)
	s.src.changed = make(chan struct{})
}

func (s *mockEventSet) wait(timeoutMs uint32) (nvml.EventData, nvml.Return) {
	t := time.NewTimer(time.Duration(timeoutMs) * time.Millisecond)
	defer t.Stop()
	select {
	case ev := <-s.src.queue:
		return ev.data, ev.ret
	case <-t.C:
		return nvml.EventData{}, nvml.ERROR_TIMEOUT
	}
}
