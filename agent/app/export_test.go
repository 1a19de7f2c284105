package app

import "github.com/gpuguard/gpuguard/agent/discovery"

// Backend is the opened discovery backend: tests reach the mock through it.
func (a *Agent) Backend() *discovery.Backend { return a.backend }

// Serving lists the resources currently served.
func (a *Agent) Serving() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for _, p := range a.serving {
		out = append(out, p.Resource())
	}
	return out
}
