// Package hardening tells whether every GPU node of the cluster refuses
// device requests in the environment, as gpuguard's node agents report it
// on their Nodes (agent --publish-node-labels). The webhook's
// hardened-cluster profile (--inject-void=auto) turns the void injection
// off only while it does.
package hardening

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpuguard/gpuguard/internal/wellknown"
)

// Nodes reads the GPU nodes' reports.
type Nodes struct {
	// Reader lists Node metadata (a metadata-only cache) and, with
	// LeaseNamespace, Leases.
	Reader client.Reader
	// GPUNodeLabels select GPU nodes: a node with any of them is one.
	GPUNodeLabels []Label
	// IsGPUResource, when set, makes a node that advertises any such
	// resource in its allocatable a GPU node too, labelled or not: a GPU
	// node without GPU Feature Discovery's or NFD's label (and so without
	// gpuguard's agent) must keep the injection on, not go unseen.
	IsGPUResource func(string) bool
	// SliceVersion, when set (one of SliceVersions, the one the API
	// server serves), makes a node on which any of GPUDRADrivers publishes
	// devices in a DRA ResourceSlice a GPU node too: its GPUs reach pods
	// through claims, with no resource in its capacity and perhaps no GPU
	// label.
	SliceVersion  string
	GPUDRADrivers []string
	// LeaseNamespace, when set, is where the agents hold their Leases. A
	// GPU node whose node enforcer holds a fresh one
	// (wellknown.EnforcerLeasePrefix) is covered, since every container it
	// creates grants exactly its allocation; and the hardened mark counts
	// only while the node's agent holds a fresh one of its own
	// (wellknown.AgentLeasePrefix): a mark left by an agent that no longer
	// runs, on a node reconfigured since, goes stale with it.
	LeaseNamespace string
	// MaxLeaseDuration is the longest a Lease counts after a renewal,
	// whatever duration its writer set; 0 is
	// wellknown.CoverageLeaseSeconds, the duration the agents write.
	MaxLeaseDuration time.Duration
	// Now is the clock Leases are judged by; nil is time.Now.
	Now func() time.Time

	mu sync.Mutex
	// renewals are the renewals of the Leases last read, by name, with
	// when this webhook first saw each.
	renewals map[string]renewal
}

// renewal is a Lease's renewal time as its writer put it, and when this
// webhook first read it.
type renewal struct{ claimed, seen time.Time }

// Label is one node label, key and value.
type Label struct{ Key, Value string }

// ParseLabel reads KEY=VALUE.
func ParseLabel(s string) (Label, error) {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return Label{}, fmt.Errorf("node label %q: want KEY=VALUE", s)
	}
	return Label{k, v}, nil
}

// Verdict is what the GPU nodes' reports say.
type Verdict struct {
	// Hardened: there is at least one GPU node and every one is covered.
	Hardened bool
	// Why names the first node that is not, or what covers them all.
	Why string
	// Until, when Hardened rests on Leases, is when the first of them goes
	// stale unless it is renewed: the verdict may change then without any
	// event, and the caller must look again. A view whose watch is cut sees
	// no renewal, so it falls back to injection at that moment.
	Until time.Time
}

// AllHardened says whether there is at least one GPU node and every GPU
// node reports wellknown.HardenedMarkLabel=true (which no kubelet can set),
// and why not when not: the first node
// that does not, or that there is none (a cluster without GPU nodes keeps
// injecting, so that the first node to join is covered before it reports).
func (n *Nodes) AllHardened(ctx context.Context) (Verdict, error) {
	list := &corev1.NodeList{}
	if err := n.Reader.List(ctx, list); err != nil {
		return Verdict{}, fmt.Errorf("listing nodes: %w", err)
	}
	fresh, err := n.freshLeases(ctx)
	if err != nil {
		return Verdict{}, err
	}
	dra, err := n.draGPUNodes(ctx)
	if err != nil {
		return Verdict{}, err
	}
	enforced, alive := fresh[wellknown.EnforcerLeasePrefix], fresh[wellknown.AgentLeasePrefix]
	var gpu []string
	var until time.Time
	for _, node := range list.Items {
		if !n.isGPUNode(node.Labels) && !n.advertisesGPUs(node.Status) && !dra[node.Name] {
			continue
		}
		marked := node.Labels[wellknown.HardenedMarkLabel] == "true"
		_, isAlive := alive[node.Name]
		_, isEnforced := enforced[node.Name]
		if marked && n.LeaseNamespace != "" && !isAlive && !isEnforced {
			return Verdict{Why: fmt.Sprintf("GPU node %s reports %s=true but its agent holds no fresh Lease (%s%s): the mark may be stale",
				node.Name, wellknown.HardenedMarkLabel, wellknown.AgentLeasePrefix, node.Name)}, nil
		}
		if !marked && !isEnforced {
			why := fmt.Sprintf("GPU node %s does not report %s=true", node.Name, wellknown.HardenedMarkLabel)
			if n.LeaseNamespace != "" {
				why += " and holds no fresh node enforcer Lease"
			}
			return Verdict{Why: why}, nil
		}
		gpu = append(gpu, node.Name)
		if n.LeaseNamespace == "" {
			continue
		}
		// The node stays covered until the last Lease it counts on goes
		// stale: its enforcer's, or, marked, its agent's.
		covered := enforced[node.Name]
		if marked && alive[node.Name].After(covered) {
			covered = alive[node.Name]
		}
		if until.IsZero() || covered.Before(until) {
			until = covered
		}
	}
	if len(gpu) == 0 {
		return Verdict{Why: "no GPU node"}, nil
	}
	slices.Sort(gpu)
	why := fmt.Sprintf("all %d GPU nodes report %s=true", len(gpu), wellknown.HardenedMarkLabel)
	if n.LeaseNamespace != "" {
		why = fmt.Sprintf("all %d GPU nodes report %s=true or run a node enforcer", len(gpu), wellknown.HardenedMarkLabel)
	}
	return Verdict{Hardened: true, Why: why, Until: until}, nil
}

// freshLeases are, by prefix (the enforcers' and the agents'), the nodes
// that hold a fresh Lease (named after the node, held by it, renewed within
// its duration), each with the time it goes stale unless renewed.
func (n *Nodes) freshLeases(ctx context.Context) (map[string]map[string]time.Time, error) {
	out := map[string]map[string]time.Time{wellknown.EnforcerLeasePrefix: {}, wellknown.AgentLeasePrefix: {}}
	if n.LeaseNamespace == "" {
		return out, nil
	}
	leases := &coordinationv1.LeaseList{}
	if err := n.Reader.List(ctx, leases, client.InNamespace(n.LeaseNamespace)); err != nil {
		return nil, fmt.Errorf("listing the agents' Leases: %w", err)
	}
	now := time.Now
	if n.Now != nil {
		now = n.Now
	}
	t := now()
	n.mu.Lock()
	defer n.mu.Unlock()
	seen := make(map[string]renewal, len(leases.Items))
	for _, l := range leases.Items {
		s := l.Spec
		stale, ok := n.countsUntil(l.Name, s, t, seen)
		if !ok || s.HolderIdentity == nil || !t.Before(stale) {
			continue
		}
		for prefix, nodes := range out {
			if node, ok := strings.CutPrefix(l.Name, prefix); ok && *s.HolderIdentity == node {
				nodes[node] = stale
			}
		}
	}
	// Leases no longer listed are forgotten: the memory is as large as the
	// namespace's Leases, not as their history.
	n.renewals = seen
	return out, nil
}

// countsUntil is when a Lease stops counting as coverage: StaleAt, except
// that the renewal counts from no later than this webhook first read it,
// and the duration is at most MaxLeaseDuration. Whoever may write a Lease
// sets its renewal time and duration, a year ahead if it likes; neither
// keeps a node covered past one duration after the webhook saw the write.
// It records the renewal in seen.
func (n *Nodes) countsUntil(name string, s coordinationv1.LeaseSpec, now time.Time, seen map[string]renewal) (time.Time, bool) {
	if s.RenewTime == nil || s.LeaseDurationSeconds == nil {
		return time.Time{}, false
	}
	r, ok := n.renewals[name]
	if !ok || !r.claimed.Equal(s.RenewTime.Time) {
		r = renewal{claimed: s.RenewTime.Time, seen: now}
	}
	seen[name] = r
	renewed := r.claimed
	if r.seen.Before(renewed) {
		renewed = r.seen
	}
	d := time.Duration(*s.LeaseDurationSeconds) * time.Second
	if max := n.maxLeaseDuration(); d > max {
		d = max
	}
	return renewed.Add(d), true
}

func (n *Nodes) maxLeaseDuration() time.Duration {
	if n.MaxLeaseDuration > 0 {
		return n.MaxLeaseDuration
	}
	return wellknown.CoverageLeaseSeconds * time.Second
}

// StaleAt is when a Lease goes stale unless renewed: its renewal plus its
// duration; false when it has either not.
func StaleAt(s coordinationv1.LeaseSpec) (time.Time, bool) {
	if s.RenewTime == nil || s.LeaseDurationSeconds == nil {
		return time.Time{}, false
	}
	return s.RenewTime.Add(time.Duration(*s.LeaseDurationSeconds) * time.Second), true
}

// advertisesGPUs reports whether a node's capacity or allocatable holds a
// GPU resource. Capacity counts too: while a device plugin restarts or has
// not registered again, the kubelet reports its resource's allocatable as
// 0, and the node's GPUs are still there for the runtime to hand out.
func (n *Nodes) advertisesGPUs(status corev1.NodeStatus) bool {
	if n.IsGPUResource == nil {
		return false
	}
	for _, list := range []corev1.ResourceList{status.Capacity, status.Allocatable} {
		for name, q := range list {
			if q.Sign() > 0 && n.IsGPUResource(string(name)) {
				return true
			}
		}
	}
	return false
}

func (n *Nodes) isGPUNode(labels map[string]string) bool {
	return slices.ContainsFunc(n.GPUNodeLabels, func(l Label) bool {
		v, ok := labels[l.Key]
		return ok && v == l.Value
	})
}
