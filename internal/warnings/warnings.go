// Package warnings collects the warnings an API server sends a client
// (admission warnings among them), which client-go would otherwise print.
package warnings

import (
	"slices"
	"sync"
)

// Collector keeps the warnings a client receives; set it as a
// rest.Config's WarningHandler.
type Collector struct {
	mu   sync.Mutex
	seen []string
}

// HandleWarningHeader implements rest.WarningHandler.
func (w *Collector) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen = append(w.seen, text)
}

// All returns the warnings received so far.
func (w *Collector) All() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.seen)
}

// Take returns the warnings received so far and forgets them.
func (w *Collector) Take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.seen
	w.seen = nil
	return out
}
