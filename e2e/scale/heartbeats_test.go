//go:build e2e

package scale

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuguard/gpuguard/e2e/framework"
	"github.com/gpuguard/gpuguard/e2e/framework/controlplane"
	"github.com/gpuguard/gpuguard/internal/wellknown"
)

var heartbeatWindow = flag.Duration("scale.heartbeat-window", 30*time.Second, "how long the agents' heartbeats are measured")

// The agents' Leases as agent/enforcer.Lease holds them: 60 s, renewed
// every third of it.
const (
	agentLeaseSeconds = 60
	agentRenewEvery   = agentLeaseSeconds * time.Second / 3
)

// maxHardeningReads bounds the webhook's reads of the hardening per minute
// while the fleet's Leases are renewed in time: at least one every
// leaseRecheck, and one whenever a Lease it rests on would go stale.
const maxHardeningReads = 30

// agentHeartbeats: every node of the fleet runs gpuguard's agent with its
// node enforcer, and each holds its two Leases (the agent's and the
// enforcer's), renewed at the agents' pace and spread over it, as a fleet
// started at different times does. Simulated at the API: the writes are the
// ones the agents make, from the suite. With every GPU node covered, the
// webhook's profile must turn the void injection off and keep it off. Over
// heartbeatWindow it measures the writes per minute the Leases cost, and
// what following them costs the webhook: its reads of the hardening and its
// CPU.
func agentHeartbeats(t *testing.T, ctx context.Context, in *controlplane.Installation, wh *controlplane.Webhook, nodes int) {
	t.Helper()
	hb := startHeartbeats(t, ctx, in.Namespace, nodes)
	err := framework.Poll(ctx, 2*time.Minute, func() (bool, error) {
		m, err := wh.Metrics(ctx)
		return err == nil && m["gpuguard_void_injection_off"] == 1, nil
	})
	if err != nil {
		t.Fatalf("with every GPU node's enforcer Lease fresh, the profile did not turn the injection off: %v\n%s", err, framework.Tail(wh.Log))
	}
	before, apiBefore := scrapeBoth(t, ctx, wh)
	writesBefore := hb.writes.Load()
	start := time.Now()
	select {
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	case <-time.After(*heartbeatWindow):
	}
	after, apiAfter := scrapeBoth(t, ctx, wh)
	minutes := time.Since(start).Minutes()
	hb.stop()
	if n := hb.failed.Load(); n > 0 {
		t.Errorf("%d Lease renewals failed; first: %v", n, hb.firstErr())
	}
	if after["gpuguard_void_injection_off"] != 1 {
		t.Error("the injection came back on while every Lease was renewed in time")
	}
	agents := float64(hb.writes.Load()-writesBefore) / minutes
	writes := (framework.SumMetrics(apiAfter, isWrite) - framework.SumMetrics(apiBefore, isWrite)) / minutes
	reads := (framework.SumMetrics(after, policyReconcile) - framework.SumMetrics(before, policyReconcile)) / minutes
	cpu := (after["process_cpu_seconds_total"] - before["process_cpu_seconds_total"]) / (minutes * 60)
	// The profile reads the hardening when a Lease would go stale, not on
	// every renewal: a few times a minute, whatever the fleet's size (one
	// read a renewal was 3,035/min at 1,000 nodes).
	if reads > maxHardeningReads {
		t.Errorf("the webhook read the hardening %.0f times a minute while %.0f renewals a minute changed nothing; want at most %d",
			reads, agents, maxHardeningReads)
	}
	t.Logf("scale: agents' heartbeats: %d nodes × 2 Leases every %s: %.0f writes/min, of %.0f/min at the API server",
		nodes, agentRenewEvery, agents, writes)
	t.Logf("scale: the webhook following them: %.1f reads of the hardening/min, %.1f%% of a core (over %s)",
		reads, 100*cpu, heartbeatWindow.Round(time.Second))
}

// isWrite and policyReconcile select metric samples: the API server's
// writes, the webhook's reads of the hardening.
func isWrite(k string) bool {
	if !strings.HasPrefix(k, "apiserver_request_total{") {
		return false
	}
	for _, verb := range []string{"CREATE", "UPDATE", "PATCH", "APPLY", "DELETE"} {
		if strings.Contains(k, `verb="`+verb+`"`) {
			return true
		}
	}
	return false
}

func policyReconcile(k string) bool {
	return strings.HasPrefix(k, "controller_runtime_reconcile_total{") && strings.Contains(k, `controller="policy"`)
}

func scrapeBoth(t *testing.T, ctx context.Context, wh *controlplane.Webhook) (webhook, apiserver map[string]float64) {
	t.Helper()
	webhook, err := wh.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	apiserver, err = s.cp.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return webhook, apiserver
}

// heartbeats renews the fleet's agent Leases until stopped.
type heartbeats struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	writes atomic.Int64
	failed atomic.Int64
	mu     sync.Mutex
	first  error
}

func (h *heartbeats) stop() { h.cancel(); h.wg.Wait() }

func (h *heartbeats) fail(err error) {
	h.failed.Add(1)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.first == nil {
		h.first = err
	}
}

func (h *heartbeats) firstErr() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.first
}

// startHeartbeats creates the fleet's agent and enforcer Leases in
// namespace and renews each every agentRenewEvery, the renewals spread
// evenly over it.
func startHeartbeats(t *testing.T, ctx context.Context, namespace string, nodes int) *heartbeats {
	t.Helper()
	leases := s.cp.Client.CoordinationV1().Leases(namespace)
	var names []string
	for i := range nodes {
		node := simulatedNode(i).Name
		for _, prefix := range []string{wellknown.AgentLeasePrefix, wellknown.EnforcerLeasePrefix} {
			holder, seconds, now := node, int32(agentLeaseSeconds), metav1.NowMicro()
			l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: prefix + node},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &seconds, RenewTime: &now}}
			if _, err := leases.Create(ctx, l, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			names = append(names, l.Name)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	h := &heartbeats{cancel: cancel}
	t.Cleanup(h.stop)
	due := make(chan string)
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		defer close(due)
		tick := time.NewTicker(agentRenewEvery / time.Duration(len(names)))
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			select {
			case <-ctx.Done():
				return
			case due <- names[i%len(names)]:
			}
		}
	}()
	for range 8 {
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			for name := range due {
				err := controlplane.RenewLease(ctx, s.cp.Client, namespace, name)
				switch {
				case err == nil:
					h.writes.Add(1)
				case ctx.Err() == nil:
					h.fail(fmt.Errorf("renewing Lease %s: %w", name, err))
				}
			}
		}()
	}
	return h
}
