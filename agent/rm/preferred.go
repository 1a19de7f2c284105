package rm

import (
	"fmt"
	"sort"
)

// Preferred picks size devices from available, keeping
// mustInclude, and keeping the pick close: all on one NUMA node when one
// can hold the request (the fullest-fitting node, so larger nodes stay free
// for larger requests), otherwise spread over as few NUMA nodes as
// possible; within a node, devices in PCI bus order, so neighbours under
// the same PCI root are taken together. Devices with an unknown NUMA node
// form a group of their own. Time-sliced shares are spread instead (see
// spreadShares). The result is deterministic.
func (s *Manager) Preferred(available, mustInclude []string, size int) ([]string, error) {
	avail, out, err := checkPreferredRequest(s, available, mustInclude, size)
	if err != nil {
		return nil, err
	}
	if s.shared {
		return spreadShares(s, avail, out, size), nil
	}
	return pickClose(avail, out, size), nil
}

// checkPreferredRequest resolves the available devices and returns them
// with the must-include ones, or says what is wrong with the request.
func checkPreferredRequest(state *Manager, available, mustInclude []string, size int) (map[string]Device, []string, error) {
	if size <= 0 {
		return nil, nil, fmt.Errorf("allocation size %d", size)
	}
	avail := map[string]Device{}
	for _, id := range available {
		d, ok := state.lookup(id)
		if !ok {
			return nil, nil, fmt.Errorf("unknown device %q", id)
		}
		if _, dup := avail[id]; dup {
			return nil, nil, fmt.Errorf("device %q listed twice", id)
		}
		avail[id] = d
	}
	if size > len(avail) {
		return nil, nil, fmt.Errorf("allocation size %d exceeds the %d available devices", size, len(avail))
	}
	var out []string
	chosen := map[string]bool{}
	for _, id := range mustInclude {
		if _, ok := avail[id]; !ok {
			return nil, nil, fmt.Errorf("must-include device %q is not available", id)
		}
		if chosen[id] {
			return nil, nil, fmt.Errorf("must-include device %q listed twice", id)
		}
		chosen[id] = true
		out = append(out, id)
	}
	if len(out) > size {
		return nil, nil, fmt.Errorf("%d must-include devices exceed the allocation size %d", len(out), size)
	}
	return avail, out, nil
}

// pickClose fills the request with devices close together (see
// Preferred).
func pickClose(avail map[string]Device, out []string, size int) []string {
	chosen := map[string]bool{}
	for _, id := range out {
		chosen[id] = true
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
				return out
			}
			out = append(out, d.ID)
			need--
		}
	}
	return out
}

// spreadShares fills a request for time-sliced shares from the least busy
// GPUs: each next share is of the GPU this request holds fewest shares of,
// then of the GPU with the most shares still free (the fewest other
// containers), so a container asking for two shares gets two GPUs where it
// can, and containers spread over the node's GPUs. Ties go in device order.
func spreadShares(state *Manager, avail map[string]Device, out []string, size int) []string {
	free := map[string]int{}  // physical UUID → shares available
	taken := map[string]int{} // physical UUID → shares in this request
	chosen := map[string]bool{}
	for _, d := range avail {
		free[d.Ref.UUID]++
	}
	for _, id := range out {
		chosen[id] = true
		taken[avail[id].Ref.UUID]++
	}
	ids := make([]string, 0, len(avail))
	for id := range avail {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return state.byID[ids[i]] < state.byID[ids[j]] })
	for len(out) < size {
		best := ""
		for _, id := range ids {
			if chosen[id] {
				continue
			}
			if best == "" || lessBusy(avail[id].Ref.UUID, avail[best].Ref.UUID, taken, free) {
				best = id
			}
		}
		chosen[best] = true
		taken[avail[best].Ref.UUID]++
		out = append(out, best)
	}
	return out
}

func lessBusy(a, b string, taken, free map[string]int) bool {
	if taken[a] != taken[b] {
		return taken[a] < taken[b]
	}
	return free[a] > free[b]
}
