package enforcer

import (
	"context"
	"sync"
	"time"

	"github.com/gpuguard/gpuguard/agent/verifier"
)

// readFresh is how long a pod's allocations, once read, serve its
// containers' creations. The kubelet records a pod's allocation when it
// admits the pod, before it starts the pod's sandbox, and keeps it for the
// pod's life (after a restart of its own, from its checkpoint), so a read
// made when the sandbox starts holds for the containers created moments
// later. The bound keeps a read from outliving what it was made for: a
// container started later (an image pulled for minutes, a restart) is read
// afresh.
const readFresh = 10 * time.Second

// podReads keeps each pod's allocations, read when its sandbox started or
// at its first container's creation, for the creations that follow: most
// containers of a pod then wait on no call to the kubelet, and a pod costs
// the kubelet's PodResources rate one call rather than one a container.
type podReads struct {
	mu    sync.Mutex
	byUID map[string]*podRead
}

// podRead is one read of a pod's allocations, done once done is closed.
type podRead struct {
	started time.Time
	done    chan struct{}
	allocs  verifier.Allocations
	err     error
}

// start begins reading the pod's allocations in the background, unless a
// fresh read is already under way or done.
func (r *podReads) start(uid string, read func(context.Context) (verifier.Allocations, error)) {
	if uid == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if e, ok := r.byUID[uid]; ok && now.Sub(e.started) < readFresh {
		return
	}
	e := &podRead{started: now, done: make(chan struct{})}
	r.keep(uid, e, now)
	go func() {
		defer close(e.done)
		ctx, cancel := context.WithTimeout(context.Background(), decisionBudget)
		defer cancel()
		e.allocs, e.err = read(ctx)
	}()
}

// get is the pod's allocations from a fresh read, waiting for one under
// way within ctx; ok is false where there is none, or it failed.
func (r *podReads) get(ctx context.Context, uid string) (allocs verifier.Allocations, ok bool) {
	r.mu.Lock()
	e, found := r.byUID[uid]
	r.mu.Unlock()
	if !found || time.Since(e.started) >= readFresh {
		return nil, false
	}
	select {
	case <-e.done:
	case <-ctx.Done():
		return nil, false
	}
	return e.allocs, e.err == nil
}

// put keeps a read made at a container's creation for the pod's next ones.
func (r *podReads) put(uid string, started time.Time, allocs verifier.Allocations) {
	if uid == "" {
		return
	}
	e := &podRead{started: started, done: make(chan struct{}), allocs: allocs}
	close(e.done)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.keep(uid, e, time.Now())
}

// keep stores a pod's read, dropping those no longer fresh; r.mu is held.
func (r *podReads) keep(uid string, e *podRead, now time.Time) {
	r.prune(now)
	if r.byUID == nil {
		r.byUID = map[string]*podRead{}
	}
	r.byUID[uid] = e
}

// forget drops a pod's read: its sandbox is gone.
func (r *podReads) forget(uid string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.byUID, uid)
}

// prune drops reads no longer fresh; r.mu is held.
func (r *podReads) prune(now time.Time) {
	for uid, e := range r.byUID {
		if now.Sub(e.started) >= readFresh {
			delete(r.byUID, uid)
		}
	}
}
