package plugin

import (
	"fmt"
	"sort"
)

// preferredAllocation picks size devices from available, keeping
// mustInclude, and keeping the pick close: all on one NUMA node when one
// can hold the request (the fullest-fitting node, so larger nodes stay free
// for larger requests), otherwise spread over as few NUMA nodes as
// possible; within a node, devices in PCI bus order, so neighbours under
// the same PCI root are taken together. Devices with an unknown NUMA node
// form a group of their own. The result is deterministic.
func preferredAllocation(state *deviceState, available, mustInclude []string, size int) ([]string, error) {
	if size <= 0 {
		return nil, fmt.Errorf("allocation size %d", size)
	}
	avail := map[string]Device{}
	for _, id := range available {
		d, ok := state.lookup(id)
		if !ok {
			return nil, fmt.Errorf("unknown device %q", id)
		}
		if _, dup := avail[id]; dup {
			return nil, fmt.Errorf("device %q listed twice", id)
		}
		avail[id] = d
	}
	if size > len(avail) {
		return nil, fmt.Errorf("allocation size %d exceeds the %d available devices", size, len(avail))
	}
	chosen := map[string]bool{}
	var out []string
	for _, id := range mustInclude {
		if _, ok := avail[id]; !ok {
			return nil, fmt.Errorf("must-include device %q is not available", id)
		}
		if chosen[id] {
			return nil, fmt.Errorf("must-include device %q listed twice", id)
		}
		chosen[id] = true
		out = append(out, id)
	}
	if len(out) > size {
		return nil, fmt.Errorf("%d must-include devices exceed the allocation size %d", len(out), size)
	}

	// Group the remaining devices by NUMA node, each group in PCI order.
	groups := map[int][]Device{}
	mustNodes := map[int]bool{}
	for _, id := range out {
		mustNodes[avail[id].NUMANode] = true
	}
	for id, d := range avail {
		if !chosen[id] {
			groups[d.NUMANode] = append(groups[d.NUMANode], d)
		}
	}
	nodes := make([]int, 0, len(groups))
	for n, g := range groups {
		sort.Slice(g, func(i, j int) bool {
			if g[i].PCIBusID != g[j].PCIBusID {
				return g[i].PCIBusID < g[j].PCIBusID
			}
			return g[i].ID < g[j].ID
		})
		nodes = append(nodes, n)
	}
	need := size - len(out)
	// Order the nodes: those already holding must-include devices first,
	// then nodes that can hold the rest alone (smallest such first), then
	// the rest by size, largest first; ties by node number.
	sort.Slice(nodes, func(i, j int) bool {
		a, b := nodes[i], nodes[j]
		if mustNodes[a] != mustNodes[b] {
			return mustNodes[a]
		}
		fa, fb := len(groups[a]) >= need, len(groups[b]) >= need
		if fa != fb {
			return fa
		}
		if len(groups[a]) != len(groups[b]) {
			if fa {
				return len(groups[a]) < len(groups[b])
			}
			return len(groups[a]) > len(groups[b])
		}
		return a < b
	})
	for _, n := range nodes {
		for _, d := range groups[n] {
			if need == 0 {
				return out, nil
			}
			out = append(out, d.ID)
			need--
		}
	}
	return out, nil
}
