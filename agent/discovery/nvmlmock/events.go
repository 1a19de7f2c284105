package nvmlmock

import (
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// Events stands in for NVML's event sets on a mock node. go-nvml's mock
// servers have none; the agent's health watcher needs one. Tests deliver
// XIDs and wait failures through it.
type Events struct {
	queue chan mockEvent

	mu         sync.Mutex
	registered map[nvml.Device]uint64
	changed    chan struct{}
}

type mockEvent struct {
	data nvml.EventData
	ret  nvml.Return
}

// NewEvents returns an event source with an empty queue.
func NewEvents() *Events {
	return &Events{
		queue:      make(chan mockEvent, 64),
		registered: map[nvml.Device]uint64{},
		changed:    make(chan struct{}),
	}
}

// SendXID queues an XID critical error event for dev (a full GPU).
func (e *Events) SendXID(dev nvml.Device, xid uint64) {
	e.SendXIDOnInstance(dev, xid, 0xFFFFFFFF, 0xFFFFFFFF)
}

// SendXIDOnInstance queues an XID event for a GPU and compute instance of dev.
func (e *Events) SendXIDOnInstance(dev nvml.Device, xid uint64, gi, ci uint32) {
	e.queue <- mockEvent{data: nvml.EventData{
		Device:            dev,
		EventType:         nvml.EventTypeXidCriticalError,
		EventData:         xid,
		GpuInstanceId:     gi,
		ComputeInstanceId: ci,
	}, ret: nvml.SUCCESS}
}

// FailWait makes a following Wait return ret (not a timeout).
func (e *Events) FailWait(ret nvml.Return) {
	e.queue <- mockEvent{ret: ret}
}

// Registered returns the event mask registered for dev, 0 if none.
func (e *Events) Registered(dev nvml.Device) uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.registered[dev]
}

// RegistrationChanged is closed at the next event registration.
func (e *Events) RegistrationChanged() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.changed
}

type mockEventSet struct {
	mock.EventSet
	src *Events
}

func (e *Events) create() (nvml.EventSet, nvml.Return) {
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
