package health

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuguard/gpuguard/agent/discovery"
)

// Update is a health change of one device (GPU or MIG device), by UUID.
type Update struct {
	ID      string
	Healthy bool
	Reason  string
}

// allInstances is NVML's GPU/compute instance ID for "not a MIG event".
const allInstances = 0xFFFFFFFF

// Watcher turns NVML XID events into health updates.
type Watcher struct {
	Lib       nvml.Interface
	Inventory *discovery.Inventory
	// Ignored XIDs do not make a device unhealthy.
	Ignored map[uint64]bool
	Log     logr.Logger
	// Update receives every health change.
	Update func(Update)
	// WaitTimeout bounds one EventSet.Wait (default 5s): the watcher
	// notices cancellation within it.
	WaitTimeout time.Duration
	// After FailureThreshold consecutive Wait failures (default 3) every
	// device is reported unhealthy, until a Wait succeeds again.
	FailureThreshold int
	// Backoff after a failed Wait doubles from MinBackoff (default 100ms)
	// up to MaxBackoff (default 30s).
	MinBackoff, MaxBackoff time.Duration
	// Sleep waits d or until ctx ends (tests replace it); nil means a timer.
	Sleep func(ctx context.Context, d time.Duration)
	// XIDs counts XID events (optional).
	XIDs *prometheus.CounterVec
}

// NewXIDCounter registers gpuguard_agent_xid_events_total with reg.
func NewXIDCounter(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpuguard_agent_xid_events_total",
		Help: "XID critical error events seen, by XID and whether it was ignored.",
	}, []string{"xid", "ignored"})
	reg.MustRegister(c)
	return c
}

type gpuTarget struct {
	gpu discovery.GPU
}

// Run registers for XID events and watches until ctx ends. It returns an
// error only when no event set can be created at all.
func (w *Watcher) Run(ctx context.Context) error {
	w.defaults()
	set, ret := w.Lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("creating an NVML event set: %v", ret)
	}
	defer set.Free()
	l := &eventLoop{w: w, targets: w.register(set), xidBad: map[string]bool{}}
	w.Log.Info("health checks running", "gpus", len(l.targets), "ignoredXIDs", len(w.Ignored))
	for ctx.Err() == nil {
		data, ret := set.Wait(uint32(w.WaitTimeout / time.Millisecond))
		if ret != nvml.SUCCESS && ret != nvml.ERROR_TIMEOUT {
			l.waitFailed(ret)
			w.Sleep(ctx, w.backoff(l.failures))
			continue
		}
		l.waitWorks()
		if ret == nvml.SUCCESS && data.EventType == nvml.EventTypeXidCriticalError {
			l.onXID(data)
		}
	}
	return nil
}

// register subscribes set to the XID events of every GPU that reports them;
// the others are logged and not health-checked.
func (w *Watcher) register(set nvml.EventSet) map[string]gpuTarget {
	targets := map[string]gpuTarget{}
	for _, g := range w.Inventory.GPUs {
		h, ret := w.Lib.DeviceGetHandleByUUID(g.UUID)
		if ret != nvml.SUCCESS {
			w.Log.Info("cannot open GPU for health checks", "gpu", g.UUID, "error", ret.Error())
			continue
		}
		supported, ret := h.GetSupportedEventTypes()
		if ret != nvml.SUCCESS || supported&nvml.EventTypeXidCriticalError == 0 {
			w.Log.Info("GPU does not report XID events; it is not health-checked", "gpu", g.UUID)
			continue
		}
		if ret := h.RegisterEvents(nvml.EventTypeXidCriticalError, set); ret != nvml.SUCCESS {
			w.Log.Info("cannot register for XID events; GPU is not health-checked", "gpu", g.UUID, "error", ret.Error())
			continue
		}
		targets[g.UUID] = gpuTarget{gpu: g}
	}
	return targets
}

// eventLoop is the state of Run between events.
type eventLoop struct {
	w       *Watcher
	targets map[string]gpuTarget
	// xidBad are the devices an XID made unhealthy: they stay so.
	xidBad map[string]bool
	// failures counts consecutive failed waits; waitDown is set once they
	// reach the threshold and every device was reported unhealthy.
	failures int
	waitDown bool
}

// waitFailed counts a failed wait; at the threshold every device not
// already failed by an XID is reported unhealthy, once.
func (l *eventLoop) waitFailed(ret nvml.Return) {
	l.failures++
	l.w.Log.Error(errors.New(ret.Error()), "waiting for NVML events failed", "consecutiveFailures", l.failures)
	if l.failures < l.w.FailureThreshold || l.waitDown {
		return
	}
	l.waitDown = true
	l.setAll(false, "NVML event wait failing: "+ret.Error())
}

// waitWorks resets the count of failed waits, and reports the devices
// healthy again after the wait itself had failed them.
func (l *eventLoop) waitWorks() {
	l.failures = 0
	if !l.waitDown {
		return
	}
	l.waitDown = false
	l.w.Log.Info("NVML event wait recovered")
	l.setAll(true, "NVML event wait recovered")
}

// setAll reports every device but those an XID failed.
func (l *eventLoop) setAll(healthy bool, reason string) {
	for _, id := range l.w.allDevices() {
		if !l.xidBad[id] {
			l.w.Update(Update{ID: id, Healthy: healthy, Reason: reason})
		}
	}
}

// onXID counts a critical XID and, unless the policy ignores it, fails the
// devices it touches for good.
func (l *eventLoop) onXID(data nvml.EventData) {
	w, xid := l.w, data.EventData
	ignored := w.Ignored[xid]
	if w.XIDs != nil {
		w.XIDs.WithLabelValues(strconv.FormatUint(xid, 10), strconv.FormatBool(ignored)).Inc()
	}
	if ignored {
		w.Log.Info("ignoring application XID", "xid", xid)
		return
	}
	ids, known := w.affected(l.targets, data)
	if !known {
		w.Log.Info("ignoring XID on a device that is not health-checked", "xid", xid)
		return
	}
	for _, id := range ids {
		if !l.xidBad[id] {
			l.xidBad[id] = true
			w.Update(Update{ID: id, Healthy: false, Reason: "XID " + strconv.FormatUint(xid, 10)})
		}
	}
}

// affected lists the devices an event touches. An event whose GPU cannot
// be told (no device, no UUID) touches every device, as in NVIDIA's
// plugin; one on a GPU that is not watched touches none (known is false).
// On a MIG-enabled GPU it touches the MIG devices of the event's GPU and
// compute instance, all of them when none matches (an instance created
// after discovery), and the GPU itself, which is the device served when
// MIG is not exposed (--mig-strategy=none).
func (w *Watcher) affected(targets map[string]gpuTarget, data nvml.EventData) (ids []string, known bool) {
	if data.Device == nil {
		return w.allDevices(), true
	}
	uuid, ret := data.Device.GetUUID()
	if ret != nvml.SUCCESS {
		return w.allDevices(), true
	}
	t, ok := targets[uuid]
	if !ok {
		return nil, false
	}
	ids = []string{t.gpu.UUID}
	var all []string
	for _, m := range t.gpu.MIG {
		all = append(all, m.UUID)
		gi, ci := data.GpuInstanceId, data.ComputeInstanceId
		if gi == allInstances || (uint32(m.GPUInstanceID) == gi && (ci == allInstances || uint32(m.ComputeInstanceID) == ci)) {
			ids = append(ids, m.UUID)
		}
	}
	if len(ids) == 1 {
		ids = append(ids, all...)
	}
	return ids, true
}

func (w *Watcher) allDevices() []string {
	var ids []string
	for _, g := range w.Inventory.GPUs {
		ids = append(ids, g.UUID)
		for _, m := range g.MIG {
			ids = append(ids, m.UUID)
		}
	}
	return ids
}

func (w *Watcher) backoff(failures int) time.Duration {
	d := w.MinBackoff
	for i := 1; i < failures && d < w.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, w.MaxBackoff)
}

func (w *Watcher) defaults() {
	if w.WaitTimeout <= 0 {
		w.WaitTimeout = 5 * time.Second
	}
	if w.FailureThreshold <= 0 {
		w.FailureThreshold = 3
	}
	if w.MinBackoff <= 0 {
		w.MinBackoff = 100 * time.Millisecond
	}
	if w.MaxBackoff <= 0 {
		w.MaxBackoff = 30 * time.Second
	}
	if w.Sleep == nil {
		w.Sleep = func(ctx context.Context, d time.Duration) {
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
			}
		}
	}
	if w.Update == nil {
		w.Update = func(Update) {}
	}
	if w.Ignored == nil {
		w.Ignored = map[uint64]bool{}
		for _, x := range DefaultIgnoredXIDs {
			w.Ignored[x] = true
		}
	}
}
