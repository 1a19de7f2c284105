package health

import (
	"context"
	"github.com/gpuguard/gpuguard/agent/discovery/nvmlmock"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpuguard/gpuguard/agent/discovery"
)

type rig struct {
	node    *nvmlmock.Node
	inv     *discovery.Inventory
	updates chan Update
	w       *Watcher
	cancel  context.CancelFunc
	done    chan error

	mu     sync.Mutex
	sleeps []time.Duration
}

func newRig(t *testing.T, system string, mig map[int][]int, tweak func(*rig)) *rig {
	t.Helper()
	node, err := nvmlmock.NewNode(system, nvmlmock.Options{NodeName: "n", MIG: mig})
	if err != nil {
		t.Fatal(err)
	}
	inv, err := discovery.Discover(node.Server, discovery.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{node: node, inv: inv, updates: make(chan Update, 100), done: make(chan error, 1)}
	r.w = &Watcher{
		Lib: node.Server, Inventory: inv, Log: logr.Discard(),
		Update:      func(u Update) { r.updates <- u },
		WaitTimeout: 20 * time.Millisecond,
		XIDs:        NewXIDCounter(prometheus.NewRegistry()),
		Sleep: func(_ context.Context, d time.Duration) {
			r.mu.Lock()
			r.sleeps = append(r.sleeps, d)
			r.mu.Unlock()
		},
	}
	if tweak != nil {
		tweak(r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- r.w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(10 * time.Second):
			t.Error("watcher did not stop")
		}
	})
	return r
}

func (r *rig) next(t *testing.T) Update {
	t.Helper()
	select {
	case u := <-r.updates:
		return u
	case <-time.After(10 * time.Second):
		t.Fatal("no health update")
	}
	return Update{}
}

func (r *rig) dev(i int) nvml.Device { return r.node.Server.Devices[i] }

func counter(t *testing.T, c *prometheus.CounterVec, labels ...string) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.WithLabelValues(labels...).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func TestCriticalXIDMarksDeviceUnhealthy(t *testing.T) {
	r := newRig(t, "dgxa100", nil, nil)
	// Ignored application XIDs first: they must not produce updates, so
	// the first update is the critical one that follows them.
	for _, x := range DefaultIgnoredXIDs {
		r.node.Events.SendXID(r.dev(3), x)
	}
	r.node.Events.SendXID(r.dev(2), 79)
	u := r.next(t)
	if u.ID != r.inv.GPUs[2].UUID || u.Healthy || u.Reason != "XID 79" {
		t.Fatalf("got %+v", u)
	}
	if got := counter(t, r.w.XIDs, "13", "true"); got != 1 {
		t.Errorf("ignored XID 13 counted %v times", got)
	}
	if got := counter(t, r.w.XIDs, "79", "false"); got != 1 {
		t.Errorf("XID 79 counted %v times", got)
	}
	// A second XID on the same GPU changes nothing; one on GPU 5 does.
	r.node.Events.SendXID(r.dev(2), 48)
	r.node.Events.SendXID(r.dev(5), 94)
	if u := r.next(t); u.ID != r.inv.GPUs[5].UUID || u.Reason != "XID 94" {
		t.Fatalf("got %+v", u)
	}
}

func TestConfiguredIgnoreList(t *testing.T) {
	r := newRig(t, "dgxh100", nil, func(r *rig) {
		r.w.Ignored = map[uint64]bool{79: true}
	})
	r.node.Events.SendXID(r.dev(0), 79)
	r.node.Events.SendXID(r.dev(1), 13) // not ignored any more
	if u := r.next(t); u.ID != r.inv.GPUs[1].UUID || u.Reason != "XID 13" {
		t.Fatalf("got %+v", u)
	}
}

// updatedIDs collects the IDs of the next n updates.
func (r *rig) updatedIDs(t *testing.T, n int) map[string]bool {
	t.Helper()
	got := map[string]bool{}
	for i := 0; i < n; i++ {
		got[r.next(t).ID] = true
	}
	return got
}

func TestMIGEventsHitTheirInstance(t *testing.T) {
	r := newRig(t, "dgxa100", nvmlmock.DefaultMIGLayout(), nil)
	gpu0 := r.inv.GPUs[0]
	target := gpu0.MIG[2]
	r.node.Events.SendXIDOnInstance(r.dev(0), 79, uint32(target.GPUInstanceID), uint32(target.ComputeInstanceID))
	// The MIG device, and the whole GPU, which is what --mig-strategy=none serves.
	got := r.updatedIDs(t, 2)
	if !got[target.UUID] || !got[gpu0.UUID] {
		t.Fatalf("marked %v, want MIG device %s and GPU %s", got, target.UUID, gpu0.UUID)
	}

	// A GPU-wide event on GPU 1 hits all its MIG devices.
	gpu1 := r.inv.GPUs[1]
	r.node.Events.SendXID(r.dev(1), 79)
	got = r.updatedIDs(t, 1+len(gpu1.MIG))
	for _, m := range gpu1.MIG {
		if !got[m.UUID] {
			t.Errorf("MIG device %s not marked", m.UUID)
		}
	}

	// An instance unknown at discovery hits its GPU's MIG devices, no others.
	r.node.Events.SendXIDOnInstance(r.dev(0), 79, 99, 0)
	got = r.updatedIDs(t, len(gpu0.MIG)-1) // all but the one already marked
	for _, m := range gpu0.MIG {
		if m.UUID != target.UUID && !got[m.UUID] {
			t.Errorf("MIG device %s of GPU 0 not marked after an unknown instance's XID", m.UUID)
		}
	}
	// An XID on GPU 2 proves no other update was queued in between.
	r.node.Events.SendXID(r.dev(2), 79)
	if u := r.next(t); u.ID != r.inv.GPUs[2].UUID {
		t.Fatalf("got %+v, want GPU 2", u)
	}
}

func TestXIDOnUnwatchedGPUIsIgnored(t *testing.T) {
	r := newRig(t, "dgxa100", nil, func(r *rig) {
		r.node.Server.Devices[4].(*server.Device).GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	})
	r.node.Events.SendXID(r.dev(4), 79)
	r.node.Events.SendXID(r.dev(5), 79)
	// Had the event on the unwatched GPU 4 marked every device, GPU 0 would come first.
	if u := r.next(t); u.ID != r.inv.GPUs[5].UUID {
		t.Fatalf("got %+v, want only GPU 5", u)
	}
}

func TestWaitFailuresBackOffThenMarkAllAndRecover(t *testing.T) {
	r := newRig(t, "dgxb200", nil, func(r *rig) {
		r.w.MinBackoff = time.Second
		r.w.MaxBackoff = 3 * time.Second
		r.w.FailureThreshold = 3
	})
	r.node.Events.SendXID(r.dev(6), 79)
	if u := r.next(t); u.ID != r.inv.GPUs[6].UUID {
		t.Fatalf("got %+v", u)
	}
	for i := 0; i < 4; i++ {
		r.node.Events.FailWait(nvml.ERROR_UNKNOWN)
	}
	down := map[string]bool{}
	for i := 0; i < 7; i++ { // every GPU but 6, which is already unhealthy
		u := r.next(t)
		if u.Healthy {
			t.Fatalf("unexpected %+v", u)
		}
		down[u.ID] = true
	}
	if down[r.inv.GPUs[6].UUID] || len(down) != 7 {
		t.Fatalf("marked %v", down)
	}
	// After the failures a Wait times out normally: devices come back,
	// except the one an XID took out.
	up := map[string]bool{}
	for i := 0; i < 7; i++ {
		u := r.next(t)
		if !u.Healthy {
			t.Fatalf("unexpected %+v", u)
		}
		up[u.ID] = true
	}
	if up[r.inv.GPUs[6].UUID] {
		t.Fatal("the XID-failed GPU must stay unhealthy")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	want := []time.Duration{time.Second, 2 * time.Second, 3 * time.Second, 3 * time.Second}
	if len(r.sleeps) != len(want) {
		t.Fatalf("slept %v, want %v", r.sleeps, want)
	}
	for i := range want {
		if r.sleeps[i] != want[i] {
			t.Fatalf("slept %v, want %v", r.sleeps, want)
		}
	}
}

func TestDevicesWithoutEventsAreSkipped(t *testing.T) {
	node, err := nvmlmock.NewNode("dgxa100", nvmlmock.Options{NodeName: "n"})
	if err != nil {
		t.Fatal(err)
	}
	node.Server.Devices[4].(*server.Device).GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	inv, _ := discovery.Discover(node.Server, discovery.Options{})
	changed := node.Events.RegistrationChanged()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	w := &Watcher{Lib: node.Server, Inventory: inv, Log: logr.Discard(), WaitTimeout: 10 * time.Millisecond}
	go func() { done <- w.Run(ctx) }()
	// Wait until the watcher registered GPU 7, the last one.
	deadline := time.After(10 * time.Second)
	for node.Events.Registered(node.Server.Devices[7]) == 0 {
		select {
		case <-changed:
			changed = node.Events.RegistrationChanged()
		case <-deadline:
			t.Fatal("GPU 7 never registered")
		}
	}
	if node.Events.Registered(node.Server.Devices[4]) != 0 {
		t.Error("GPU 4 has no event support but was registered")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func TestEventSetUnavailable(t *testing.T) {
	node, _ := nvmlmock.NewNode("dgxa100", nvmlmock.Options{NodeName: "n"})
	node.Server.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
	inv, _ := discovery.Discover(node.Server, discovery.Options{})
	w := &Watcher{Lib: node.Server, Inventory: inv, Log: logr.Discard()}
	if err := w.Run(context.Background()); err == nil {
		t.Fatal("no error without an event set")
	}
}

func TestParseXIDs(t *testing.T) {
	m, err := ParseXIDs(FormatXIDs(DefaultIgnoredXIDs))
	if err != nil || len(m) != 6 || !m[109] {
		t.Fatalf("%v %v", m, err)
	}
	if m, err := ParseXIDs("none"); err != nil || len(m) != 0 {
		t.Fatalf("none: %v %v", m, err)
	}
	if _, err := ParseXIDs("13,x"); err == nil {
		t.Fatal("bad XID: no error")
	}
}
