package verifier

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/go-logr/logr"
)

// Actions are what the verifier does about a finding beyond logs and
// metrics: a Kubernetes Event on the pod, and in enforce mode stopping the
// container and deleting its pod. Nil when the agent has no API access.
type Actions interface {
	// Event records the new findings of one container in one Event.
	Event(ctx context.Context, findings []Finding) error
	// Stop ends the finding's container at once and deletes its pod,
	// outside the Eviction API (Kube.Stop says why).
	Stop(ctx context.Context, f Finding) error
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
	if r.processesErr.changed(p.ProcessesErr) && p.ProcessesErr != nil {
		r.Log.Error(p.ProcessesErr, "NVML's process view is unavailable; judging by device nodes alone")
	}
	r.Metrics.Containers.Set(float64(p.Containers))
	r.Metrics.setFindings(p.Findings)
	live := map[string]bool{}
	stopped := map[string]bool{} // containers stopped this pass
	var fresh []Finding          // new findings, one container's after another
	for _, f := range p.Findings {
		key := f.Container.ID + "/" + f.GPU.UUID
		live[key] = true
		if !r.reported[key] {
			r.logFinding(f)
			if f.Exempt == "" {
				fresh = append(fresh, f)
			}
		}
		// Acted on every pass while the finding stands: a container the
		// kubelet restarts is stopped again.
		if f.Exempt == "" && f.ReportOnly == "" && r.Mode == ModeEnforce && !stopped[f.Container.ID] && r.Actions != nil {
			stopped[f.Container.ID] = true
			r.stop(ctx, f)
		}
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
	if f.SeenBy == SeenByUnverifiable {
		r.Log.Info("FINDING: container cannot be verified: its /dev holds more than 10000 entries", "namespace", f.Container.Key.Namespace,
			"pod", f.Container.Key.Pod, "container", f.Container.Key.Container, "containerID", f.Container.ID, "exempt", f.Exempt, "mode", r.Mode)
		return
	}
	kv := []any{"namespace", f.Container.Key.Namespace, "pod", f.Container.Key.Pod, "container", f.Container.Key.Container,
		"containerID", f.Container.ID, "gpu", f.GPU.UUID, "path", f.GPU.Path, "seenBy", f.SeenBy, "allocated", f.Allocated}
	if f.Exempt != "" {
		r.Log.Info("exempt pod reaches a GPU it was not allocated", append(kv, "exempt", f.Exempt)...)
		return
	}
	if f.ReportOnly != "" {
		kv = append(kv, "reportOnly", f.ReportOnly)
	}
	r.Log.Info("FINDING: container reaches a GPU it was not allocated", append(kv, "mode", r.Mode)...)
}

// stop ends the finding's container and deletes its pod; a failure is
// logged and counted, and tried again next pass while the finding stands.
func (r *Reporter) stop(ctx context.Context, f Finding) {
	k := f.Container.Key
	if err := r.Actions.Stop(ctx, f); err != nil {
		r.Metrics.Evictions.WithLabelValues("error").Inc()
		r.Log.Error(err, "cannot stop a container that reaches a GPU it was not allocated; trying again next pass", "namespace", k.Namespace, "pod", k.Pod)
		return
	}
	r.Metrics.Evictions.WithLabelValues("stopped").Inc()
	r.Log.Info("stopped a container that reaches a GPU it was not allocated, and deleted its pod", "namespace", k.Namespace, "pod", k.Pod,
		"container", k.Container, "gpu", f.GPU.UUID)
}

// Message is the human sentence of one container's findings, for Events.
func Message(findings []Finding) string {
	f := findings[0]
	if f.SeenBy == SeenByUnverifiable {
		return fmt.Sprintf("container %q cannot be verified: its /dev holds more than 10000 entries, so which GPUs it can open is unknown; "+
			"it is treated as reaching GPUs it was not allocated", f.Container.Key.Container)
	}
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
