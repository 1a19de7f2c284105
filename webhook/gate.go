package webhook

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/gpuguard/gpuguard/webhook/policysource"
)

// Limits bound the reviews the webhook works on at once.
type Limits struct {
	// MaxReviews is how many reviews may be in flight.
	MaxReviews int64
	// MaxReviewBytes is how many request body bytes may be in flight: a few
	// reviews of the largest objects the API server stores take the memory of
	// thousands of ordinary ones.
	MaxReviewBytes int64
	// Wait is how long a review waits for room before it is turned away.
	Wait time.Duration
}

// DefaultLimits suit the chart's 256 MiB webhook: at most five reviews of
// the largest pods the API server stores (about 3 MiB each), and 256 of
// ordinary ones.
func DefaultLimits() Limits {
	return Limits{MaxReviews: 256, MaxReviewBytes: 16 << 20, Wait: 250 * time.Millisecond}
}

// Validate rejects limits that would turn every review away.
func (l Limits) Validate() error {
	if l.MaxReviews < 1 {
		return fmt.Errorf("--max-inflight-reviews=%d: want at least 1", l.MaxReviews)
	}
	if l.MaxReviewBytes < maxReviewBytes {
		return fmt.Errorf("--max-inflight-review-bytes=%d: want at least %d, the largest review accepted", l.MaxReviewBytes, maxReviewBytes)
	}
	return nil
}

// gate answers an HTTP error, never an admission verdict, when the webhook
// cannot decide: 503 before a policy is loaded and while shutting down, 429
// when too many reviews are in flight. The API server counts any of them as
// a failed call, so the webhook's failurePolicy decides, which an answer of
// "denied" would not let it do.
type gate struct {
	policyLoaded func() bool
	stopping     <-chan struct{}
	limits       Limits
	reviews      *semaphore.Weighted
	bytes        *semaphore.Weighted
	metrics      *Metrics
}

func newGate(l Limits, policyLoaded func() bool, stopping <-chan struct{}, m *Metrics) *gate {
	return &gate{policyLoaded: policyLoaded, stopping: stopping, limits: l,
		reviews: semaphore.NewWeighted(l.MaxReviews), bytes: semaphore.NewWeighted(l.MaxReviewBytes), metrics: m}
}

// wrap puts the gate in front of next.
func (g *gate) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-g.stopping:
			g.refuse(w, http.StatusServiceUnavailable, "stopping", "gpuguard webhook is shutting down")
			return
		default:
		}
		if !g.policyLoaded() {
			g.refuse(w, http.StatusServiceUnavailable, "no-policy", policysource.ErrNoPolicy.Error())
			return
		}
		weight := g.weight(r)
		release, ok := g.acquire(r.Context(), weight)
		if !ok {
			g.refuse(w, http.StatusTooManyRequests, "overloaded", "gpuguard webhook has too many reviews in flight")
			return
		}
		defer release()
		next.ServeHTTP(w, r)
	})
}

// weight is what a review counts against the byte limit: its declared
// length, or the most requireRequest reads when it declares none.
func (g *gate) weight(r *http.Request) int64 {
	if r.ContentLength >= 0 && r.ContentLength <= maxReviewBytes {
		return max(r.ContentLength, 1)
	}
	return maxReviewBytes
}

// acquire waits up to limits.Wait for room for one review of weight bytes.
func (g *gate) acquire(ctx context.Context, weight int64) (release func(), ok bool) {
	ctx, cancel := context.WithTimeout(ctx, g.limits.Wait)
	defer cancel()
	if err := g.reviews.Acquire(ctx, 1); err != nil {
		return nil, false
	}
	if err := g.bytes.Acquire(ctx, weight); err != nil {
		g.reviews.Release(1)
		return nil, false
	}
	return func() { g.bytes.Release(weight); g.reviews.Release(1) }, true
}

func (g *gate) refuse(w http.ResponseWriter, status int, reason, msg string) {
	if g.metrics != nil {
		g.metrics.Refused.WithLabelValues(reason).Inc()
	}
	w.Header().Set("Retry-After", strconv.Itoa(1))
	http.Error(w, msg, status)
}
