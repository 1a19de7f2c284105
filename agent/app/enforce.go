package app

import (
	"context"
	"os"
	"sync/atomic"
	"time"

	"github.com/gpuguard/gpuguard/agent/discovery"
	"github.com/gpuguard/gpuguard/agent/enforcer"
	"github.com/gpuguard/gpuguard/agent/verifier"
)

// startEnforcer runs the node enforcer in the session until it stops: an
// NRI plugin that connects to the runtime (again after each restart) and
// reads the policy's exemptions and rules again every verify interval.
func (a *Agent) startEnforcer(ctx context.Context, s *session, inv *discovery.Inventory) error {
	if !a.cfg.Enforce {
		return nil
	}
	pol := a.verifierPolicy()
	rules, err := enforcer.NewRules(pol, inv)
	if err != nil {
		return err
	}
	allocations, err := verifier.DialPodResources(a.cfg.PodResourcesSocket)
	if err != nil {
		return err
	}
	current := &atomic.Pointer[enforcer.Rules]{}
	current.Store(rules)
	ex := &verifier.Exemptions{Client: a.kube}
	ex.Set(pol, a.cfg.VerifyExemptNamespaces)
	p := &enforcer.Plugin{Rules: current, Allocations: allocations, Exemptions: ex,
		Client: a.kube, Node: a.cfg.NodeName, Log: a.log.WithName("enforce"),
		Decisions: a.enforceDecisions, Latency: a.enforceLatency}
	ns := a.cfg.EnforcerLeaseNamespace
	if ns == "" {
		ns = os.Getenv("POD_NAMESPACE")
	}
	if a.kube != nil && ns != "" {
		p.Lease = &enforcer.Lease{Client: a.kube, Namespace: ns, Node: a.cfg.NodeName, Duration: enforcer.DefaultLeaseDuration, Log: p.Log}
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
				current.Store(r)
				ex.Set(pol, a.cfg.VerifyExemptNamespaces)
			}
		}
	}()
	return nil
}
