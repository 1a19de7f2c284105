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
	// LeaseNamespace, when set, is where the agents hold their Leases. A
	// GPU node whose node enforcer holds a fresh one
	// (wellknown.EnforcerLeasePrefix) is covered, since every container it
	// creates grants exactly its allocation; and the hardened mark counts
	// only while the node's agent holds a fresh one of its own
	// (wellknown.AgentLeasePrefix): a mark left by an agent that no longer
	// runs, on a node reconfigured since, goes stale with it.
	LeaseNamespace string
	// Now is the clock Leases are judged by; nil is time.Now.
	Now func() time.Time
}

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
	enforced, alive := fresh[wellknown.EnforcerLeasePrefix], fresh[wellknown.AgentLeasePrefix]
	var gpu []string
	var until time.Time
	for _, node := range list.Items {
		if !n.isGPUNode(node.Labels) && !n.advertisesGPUs(node.Status.Allocatable) {
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
	for _, l := range leases.Items {
		s := l.Spec
		stale, ok := StaleAt(s)
		if !ok || s.HolderIdentity == nil || !now().Before(stale) {
			continue
		}
		for prefix, nodes := range out {
			if node, ok := strings.CutPrefix(l.Name, prefix); ok && *s.HolderIdentity == node {
				nodes[node] = stale
			}
		}
	}
	return out, nil
}

// StaleAt is when a Lease goes stale unless renewed: its renewal plus its
// duration; false when it has either not.
func StaleAt(s coordinationv1.LeaseSpec) (time.Time, bool) {
	if s.RenewTime == nil || s.LeaseDurationSeconds == nil {
		return time.Time{}, false
	}
	return s.RenewTime.Add(time.Duration(*s.LeaseDurationSeconds) * time.Second), true
}

// advertisesGPUs reports whether a node's allocatable holds a GPU resource.
func (n *Nodes) advertisesGPUs(allocatable corev1.ResourceList) bool {
	if n.IsGPUResource == nil {
		return false
	}
	for name, q := range allocatable {
		if q.Sign() > 0 && n.IsGPUResource(string(name)) {
			return true
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
