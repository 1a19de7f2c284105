package app

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gpuguard/gpuguard/agent/discovery"
	"github.com/gpuguard/gpuguard/agent/enforcer"
	"github.com/gpuguard/gpuguard/agent/nodereport"
	"github.com/gpuguard/gpuguard/agent/verifier"
	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/internal/wellknown"
)

// startEnforcer runs the node enforcer in the session until it stops: an
// NRI plugin that connects to the runtime (again after each restart) and
// reads the policy's exemptions and rules again every verify interval.
func (a *Agent) startEnforcer(ctx context.Context, s *session, inv *discovery.Inventory, in nodereport.Inputs) error {
	if !a.cfg.Enforce {
		return nil
	}
	pol := a.verifierPolicy()
	namer, specs, err := a.enforcerCDI(pol, in)
	if err != nil {
		return err
	}
	// The drivers' majors, read once: a creation reads no file for them.
	majors, err := enforcer.ReadDeviceMajors(filepath.Join(a.cfg.ProcRoot, "devices"))
	if err != nil {
		a.log.Error(err, "the node enforcer knows the GPU nodes' major only; it judges the other NVIDIA device nodes by their paths")
	}
	a.log.Info("node enforcer device majors", "majors", majors)
	rules, err := enforcer.NewRules(pol, inv)
	if err != nil {
		return err
	}
	// Mount sources resolved in the host's file system, where the runtime
	// follows their links.
	host, err := enforcer.NewHostResolver(a.cfg.HostRoot)
	if err != nil {
		return err
	}
	rules.WithCDI(namer).WithCDIInjector(specs).WithDeviceMajors(majors).WithHostRoot(host)
	allocations, err := verifier.DialPodResources(a.cfg.PodResourcesSocket)
	if err != nil {
		return err
	}
	current := &atomic.Pointer[enforcer.Rules]{}
	current.Store(rules)
	// The policy's exemptions only: its namespaces and its (namespace,
	// service account) pairs with the rules they waive. The verifier's
	// --verify-exempt-namespaces only quiets its reports; a namespace there
	// exempts no container from the enforcer.
	ex := &verifier.Exemptions{Client: a.unqueued}
	ex.Set(pol, nil)
	p := &enforcer.Plugin{Rules: current, Allocations: allocations, Checkpoint: verifier.NewCheckpoint(a.cfg.DevicePluginDir), Exemptions: ex,
		Client: a.kube, Node: a.cfg.NodeName, Log: a.log.WithName("enforce"),
		Decisions: a.enforceDecisions, Latency: a.enforceLatency, Reads: a.enforceReads,
		Validations: a.enforceValidations, ValidationLatency: a.enforceValidationLatency}
	if ns := a.leaseNamespace(); a.unqueued != nil && ns != "" {
		// The node counts as covered only where it fails closed: while
		// containerd requires the enforcer (the hardening report's
		// gpuguard_nri_required), read again at each assessment.
		p.Lease = &enforcer.Lease{Client: a.unqueued, Namespace: ns, Node: a.cfg.NodeName, Duration: enforcer.DefaultLeaseDuration, Log: p.Log,
			Covers: a.enforcerRequired.Load}
	}
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		defer allocations.Close()
		p.Run(ctx, a.cfg.NRISocket, enforcer.ReconnectInterval)
	}()
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(a.cfg.VerifyInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			pol := a.verifierPolicy()
			if r, err := enforcer.NewRules(pol, inv); err == nil {
				current.Store(r.WithCDI(namer).WithCDIInjector(specs).WithDeviceMajors(majors).WithHostRoot(host))
				ex.Set(pol, nil)
			}
		}
	}()
	return nil
}

// enforcerCDI writes the enforcer's void device into the agent's CDI
// directory and reads the node's specs: for the allocated devices' names
// (the toolkit's kind first, then the agent's own), and to resolve the CDI
// devices NRI plugins ask for. A directory that cannot be written is no
// reason to stop: such a node refuses, rather than narrows, a container
// with a device variable set twice (namer is nil); the specs are still
// read.
func (a *Agent) enforcerCDI(pol *config.Policy, in nodereport.Inputs) (namer enforcer.CDINamer, specs *enforcer.SpecDirs, err error) {
	dir := filepath.Join(a.cfg.HostRoot, a.cfg.CDISpecDir)
	path, werr := enforcer.WriteVoidSpec(dir, pol.Spec.DeviceVariables())
	if werr != nil {
		a.log.Error(werr, "the node enforcer will refuse, not narrow, containers that set a device variable more than once")
	} else {
		a.log.Info("node enforcer CDI spec", "path", path, "device", enforcer.VoidDevice)
	}
	dirs, kinds := []string{dir}, []string{"nvidia.com/gpu", wellknown.CDIKind}
	toolkitDirs := []string{"/etc/cdi", "/var/run/cdi"}
	if in.Toolkit != nil {
		toolkitDirs, kinds[0] = in.Toolkit.CDISpecDirs, in.Toolkit.CDIDefaultKind
	}
	for _, d := range toolkitDirs {
		if d := filepath.Join(a.cfg.HostRoot, d); !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	specs, err = enforcer.NewSpecDirs(dirs, kinds)
	if err != nil {
		return nil, nil, fmt.Errorf("reading CDI specs in %s: %w", strings.Join(dirs, ", "), err)
	}
	specs.HostRoot = a.cfg.HostRoot
	if werr != nil {
		return nil, specs, nil
	}
	return specs, specs, nil
}

// leaseNamespace is where the agent holds its Leases: the flag's, else its
// own pod's namespace.
func (a *Agent) leaseNamespace() string {
	if ns := a.cfg.EnforcerLeaseNamespace; ns != "" {
		return ns
	}
	return os.Getenv("POD_NAMESPACE")
}

// agentLease is the heartbeat of the node labels the agent publishes
// (wellknown.AgentLeasePrefix and the node's name), held while it runs:
// where the webhook follows Leases, the hardened mark counts only while it
// is fresh. nil when the agent publishes no labels or has no API access.
func (a *Agent) agentLease() *enforcer.Lease {
	ns := a.leaseNamespace()
	if a.nodeLabels == nil || a.unqueued == nil || ns == "" {
		return nil
	}
	return &enforcer.Lease{Client: a.unqueued, Namespace: ns, Node: a.cfg.NodeName, Name: wellknown.AgentLeasePrefix + a.cfg.NodeName,
		Duration: enforcer.DefaultLeaseDuration, Log: a.log.WithName("lease")}
}
