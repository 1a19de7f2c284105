package app

import (
	"context"
	"maps"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/gpuguard/gpuguard/agent/nodereport"
)

// assessment is what the last look at the node's hardening found and wrote.
type assessment struct {
	mu sync.Mutex
	// version is the toolkit's version, probed once (it runs a binary).
	version      string
	versionKnown bool
	// summary is the last report's, so that only a change is logged.
	summary string
	// published are the labels last written to the Node; nil until then.
	published map[string]string
	// passes counts assessments, for tests to wait on.
	passes int
}

// reportHardening reads the toolkit's and containerd's configuration and
// reports how hardened the node is: metrics, logs (when the report
// changed) and, if asked, node labels. A start writes the labels whatever
// was written before; a refresh writes them only when they changed, so the
// agent's API writes grow with changes to the node, not with time.
func (a *Agent) reportHardening(ctx context.Context, start bool) nodereport.Inputs {
	as := &a.assessed
	as.mu.Lock()
	defer as.mu.Unlock()
	loc := a.locator()
	if !as.versionKnown || start {
		as.version = a.cfg.ToolkitVersion
		if as.version == "" {
			as.version = loc.ProbeToolkitVersion(ctx)
		}
		as.versionKnown = true
	}
	in := loc.Collect(as.version)
	a.enforcerRequired.Store(in.Containerd != nil && in.Containerd.RequiresEnforcer())
	report := nodereport.BuildReport(in)
	a.hardening.Set(report)
	if summary := report.String(); start || summary != as.summary {
		for _, c := range report.Checks {
			a.log.Info("node hardening check", "check", c.ID, "status", c.Status, "value", c.Value, "detail", c.Detail)
		}
		a.log.Info("node hardening report", "hardened", report.Hardened(), "summary", summary, "changed", !start)
		as.summary = summary
	}
	if labels := report.Labels(); a.nodeLabels != nil && (start || !maps.Equal(labels, as.published)) {
		if err := a.nodeLabels.publish(ctx, labels); err != nil {
			a.log.Error(err, "cannot publish the hardening report as node labels")
			as.published = nil // written again on the next refresh
		} else {
			as.published = labels
		}
	}
	as.passes++
	return in
}

// hardeningPasses is how many assessments have run.
func (a *Agent) hardeningPasses() int {
	a.assessed.mu.Lock()
	defer a.assessed.mu.Unlock()
	return a.assessed.passes
}

// refreshHardening assesses the node again every --hardening-interval, and
// at once when a file changes in the directories of the toolkit's or
// containerd's configuration: a node reconfigured after the agent started
// (the toolkit's accept-envvar switch turned back on, say) loses its
// hardened mark within the interval, so the webhook injects void again.
func (a *Agent) refreshHardening(ctx context.Context) {
	if a.cfg.HardeningInterval <= 0 {
		return
	}
	changed, stop := a.watchConfigDirs()
	defer stop()
	tick := time.NewTicker(a.cfg.HardeningInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-changed:
		}
		a.reportHardening(ctx, false)
	}
}

// watchConfigDirs reports changes in the directories of the configuration
// files the node has (editors and installers replace files by renaming, so
// directories are watched, not files). Without a watch the interval alone
// refreshes the report.
func (a *Agent) watchConfigDirs() (<-chan struct{}, func()) {
	loc := a.locator()
	var dirs []string
	if p, err := loc.FindToolkitConfig(); err == nil && p != "" {
		dirs = append(dirs, filepath.Dir(p))
	}
	if c, err := loc.LoadContainerdConfig(); err == nil && c != nil {
		for _, p := range c.Paths {
			dirs = append(dirs, filepath.Dir(p))
		}
	}
	slices.Sort(dirs)
	dirs = slices.Compact(dirs)
	w, err := fsnotify.NewWatcher()
	if err != nil {
		a.log.Error(err, "cannot watch the toolkit's and containerd's configuration; the hardening report is refreshed on its interval alone")
		return nil, func() {}
	}
	for _, d := range dirs {
		if err := w.Add(filepath.Join(a.cfg.HostRoot, d)); err != nil {
			a.log.Error(err, "cannot watch a configuration directory; it is read again on the interval", "dir", d)
		}
	}
	changed := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case _, ok := <-w.Events:
				if !ok {
					return
				}
				select {
				case changed <- struct{}{}:
				default: // one pending assessment covers every change before it
				}
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				a.log.Error(err, "watching the configuration directories")
			}
		}
	}()
	return changed, func() { w.Close(); <-done }
}
