package verifier

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/go-logr/logr"
)

// Actions are what the verifier does about a finding beyond logs and
// metrics: a Kubernetes Event on the pod, and in enforce mode an eviction.
// Nil when the agent has no API access.
type Actions interface {
	// Event records the new findings of one container in one Event.
	Event(ctx context.Context, findings []Finding) error
	// Evict evicts the pod through the Eviction API; refused is true when a
	// PodDisruptionBudget holds it back (it is tried again next pass).
	Evict(ctx context.Context, f Finding) (refused bool, err error)
}

// Reporter records passes: a JSON log line per new finding, the metrics,
// an Event per new finding, and in enforce mode the eviction of its pod.
type Reporter struct {
	Mode    string
	Log     logr.Logger
	Metrics *Metrics
	Actions Actions
	// Node, when set, keeps the node's ClusterReport in line with each pass.
	Node *NodeReport

	// reported holds "containerID/uuid" of findings already logged.
	reported map[string]bool
	// A runtime or kubelet that stays away, a ClusterReport that cannot be
	// written, NVML without a process view: each logged once, not every pass.
	passErr, reportErr, processesErr onceErr
	// evicted holds the UIDs of pods already evicted: a terminating pod is not
	// evicted again every pass (a DaemonSet's replacement has a new UID).
	evicted map[string]bool
}

// Report takes one pass (or the error that stopped it).
func (r *Reporter) Report(ctx context.Context, p Pass, err error) {
	if err != nil {
		r.Metrics.Passes.WithLabelValues("error").Inc()
		if r.passErr.changed(err) {
			r.Log.Error(err, "verifier pass failed; trying again every interval")
		}
		return
	}
	if r.passErr.changed(nil) {
		r.Log.Info("verifier passes succeed again")
	}
	r.Metrics.Passes.WithLabelValues("ok").Inc()
	r.Metrics.Unverified.WithLabelValues("gone").Set(float64(p.Skipped))
	r.Metrics.Unverified.WithLabelValues("dev-too-large").Set(float64(len(p.Unverifiable)))
	for _, c := range p.Unverifiable {
		if !r.reported[c.ID+"/unverifiable"] {
			r.Log.Info("FINDING: container cannot be verified: its /dev holds more than 10000 entries", "namespace", c.Key.Namespace,
				"pod", c.Key.Pod, "container", c.Key.Container, "containerID", c.ID)
		}
	}
	if r.processesErr.changed(p.ProcessesErr) && p.ProcessesErr != nil {
		r.Log.Error(p.ProcessesErr, "NVML's process view is unavailable; judging by device nodes alone")
	}
	r.Metrics.Containers.Set(float64(p.Containers))
	r.Metrics.setFindings(p.Findings)
	live := map[string]bool{}
	if r.evicted == nil {
		r.evicted = map[string]bool{}
	}
	running := map[string]bool{}
	var fresh []Finding // new findings, one container's after another
	for _, f := range p.Findings {
		key := f.Container.ID + "/" + f.GPU.UUID
		live[key] = true
		if !r.reported[key] {
			r.logFinding(f)
			if f.Exempt == "" {
				fresh = append(fresh, f)
			}
		}
		running[f.Container.PodUID] = true
		if f.Exempt == "" && r.Mode == ModeEnforce && !r.evicted[f.Container.PodUID] && r.Actions != nil {
			r.evicted[f.Container.PodUID] = r.evict(ctx, f)
		}
	}
	for uid := range r.evicted {
		if !running[uid] {
			delete(r.evicted, uid)
		}
	}
	for _, c := range p.Unverifiable {
		live[c.ID+"/unverifiable"] = true
	}
	r.reported = live
	r.recordEvents(ctx, fresh)
	if r.Node != nil {
		err := r.Node.Write(ctx, p, time.Now())
		if r.reportErr.changed(err) && err != nil {
			r.Log.Error(err, "cannot write the node's ClusterReport; findings are in logs, metrics and Events")
		}
	}
}

// recordEvents records one Event per container for its new findings.
func (r *Reporter) recordEvents(ctx context.Context, fresh []Finding) {
	if r.Actions == nil {
		return
	}
	for start := 0; start < len(fresh); {
		end := start + 1
		for end < len(fresh) && fresh[end].Container.ID == fresh[start].Container.ID {
			end++
		}
		if err := r.Actions.Event(ctx, fresh[start:end]); err != nil {
			k := fresh[start].Container.Key
			r.Log.Error(err, "cannot record an Event for a finding", "namespace", k.Namespace, "pod", k.Pod)
		}
		start = end
	}
}

func (r *Reporter) logFinding(f Finding) {
	kv := []any{"namespace", f.Container.Key.Namespace, "pod", f.Container.Key.Pod, "container", f.Container.Key.Container,
		"containerID", f.Container.ID, "gpu", f.GPU.UUID, "path", f.GPU.Path, "seenBy", f.SeenBy, "allocated", f.Allocated}
	if f.Exempt != "" {
		r.Log.Info("exempt pod reaches a GPU it was not allocated", append(kv, "exempt", f.Exempt)...)
		return
	}
	r.Log.Info("FINDING: container reaches a GPU it was not allocated", append(kv, "mode", r.Mode)...)
}

// evict evicts the finding's pod and reports whether it was: a refused or
// failed eviction is tried again next pass.
func (r *Reporter) evict(ctx context.Context, f Finding) bool {
	k := f.Container.Key
	refused, err := r.Actions.Evict(ctx, f)
	switch {
	case err != nil:
		r.Metrics.Evictions.WithLabelValues("error").Inc()
		r.Log.Error(err, "cannot evict a pod that reaches a GPU it was not allocated", "namespace", k.Namespace, "pod", k.Pod)
		return false
	case refused:
		r.Metrics.Evictions.WithLabelValues("refused").Inc()
		r.Log.Info("eviction refused (a PodDisruptionBudget holds the pod); trying again next pass", "namespace", k.Namespace, "pod", k.Pod)
		return false
	}
	r.Metrics.Evictions.WithLabelValues("evicted").Inc()
	r.Log.Info("evicted a pod that reaches a GPU it was not allocated", "namespace", k.Namespace, "pod", k.Pod, "gpu", f.GPU.UUID)
	return true
}

// Message is the human sentence of one container's findings, for Events.
func Message(findings []Finding) string {
	f := findings[0]
	alloc := "no GPU"
	if len(f.Allocated) > 0 {
		alloc = strings.Join(f.Allocated, ", ")
	}
	var gpus []string
	for _, g := range findings {
		gpus = append(gpus, g.GPU.UUID+" ("+g.GPU.Path+")")
	}
	return fmt.Sprintf("container %q can open GPUs it was not allocated: %s; the kubelet allocated it %s. "+
		"Admission did not stop it (image ENV, a Secret, a pod from before install or a webhook outage, an exempt namespace, or a node channel)",
		f.Container.Key.Container, strings.Join(gpus, ", "), alloc)
}

// onceErr remembers the last error seen, so that a lasting problem is logged
// when it starts, changes or ends, not every pass.
type onceErr struct{ last string }

// changed records err (nil for none) and reports whether it differs from the last.
func (o *onceErr) changed(err error) bool {
	now := ""
	if err != nil {
		now = err.Error()
	}
	changed := now != o.last
	o.last = now
	return changed
}
