package webhook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
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
	// BodyRead bounds how long a review's body may take to arrive: a
	// sender that stalls is cut off, so that idle connections hold nothing.
	BodyRead time.Duration

	// What a connection may hold before its request reaches the gate.
	// MaxHeaderBytes bounds a request's line and headers (more: HTTP 431);
	// net/http reads up to 4 KiB past it before it refuses.
	MaxHeaderBytes int
	// ReadHeaderTimeout bounds a connection's TLS handshake and each
	// request's line and headers; a sender that stalls is cut off.
	ReadHeaderTimeout time.Duration
	// IdleTimeout closes a keep-alive connection idle this long.
	IdleTimeout time.Duration
	// MaxConnections is how many connections are served at once; more
	// wait, unaccepted, in the kernel's queue until one closes.
	MaxConnections int
}

// DefaultLimits suit the chart's 256 MiB webhook: at most five reviews of
// the largest pods the API server stores (about 3 MiB each), and 256 of
// ordinary ones; 512 connections, each holding at most 16 KiB of headers
// for at most 10 s (docs/operations.md has the arithmetic).
func DefaultLimits() Limits {
	return Limits{MaxReviews: 256, MaxReviewBytes: 16 << 20, Wait: 250 * time.Millisecond, BodyRead: 2 * time.Second,
		MaxHeaderBytes: 16 << 10, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 90 * time.Second, MaxConnections: 512}
}

// headerReadSlack is what net/http reads of a request's line and headers
// past MaxHeaderBytes before it refuses them.
const headerReadSlack = 4096

// MaxHeaderMemory bounds the request line and header bytes the connections
// hold at once: every connection reading headers, each up to
// MaxHeaderBytes and net/http's slack.
func (l Limits) MaxHeaderMemory() int64 {
	return int64(l.MaxConnections) * int64(l.MaxHeaderBytes+headerReadSlack)
}

// minHeaderBytes is the least MaxHeaderBytes allowed: an AdmissionReview
// request's line and headers from kube-apiserver take a few hundred bytes.
const minHeaderBytes = 1 << 10

// validate rejects limits that would turn every review away, as
// Config.Validate's FieldErrors.
func (l Limits) validate() []error {
	var errs []error
	if l.MaxReviews < 1 {
		errs = append(errs, &FieldError{"limits.maxReviews", fmt.Sprintf("%d: want at least 1", l.MaxReviews)})
	}
	if l.MaxReviewBytes < maxReviewBytes {
		errs = append(errs, &FieldError{"limits.maxReviewBytes", fmt.Sprintf("%d: want at least %d, the largest review accepted", l.MaxReviewBytes, maxReviewBytes)})
	}
	if l.Wait < 0 {
		errs = append(errs, &FieldError{"limits.wait", fmt.Sprintf("%s: must not be negative", l.Wait)})
	}
	if l.BodyRead < 0 {
		errs = append(errs, &FieldError{"limits.bodyRead", fmt.Sprintf("%s: must not be negative", l.BodyRead)})
	}
	if l.MaxHeaderBytes < minHeaderBytes {
		errs = append(errs, &FieldError{"limits.maxHeaderBytes", fmt.Sprintf("%d: want at least %d", l.MaxHeaderBytes, minHeaderBytes)})
	}
	if l.ReadHeaderTimeout <= 0 {
		errs = append(errs, &FieldError{"limits.readHeaderTimeout", fmt.Sprintf("%s: must be positive: without it a connection may hold its headers forever", l.ReadHeaderTimeout)})
	}
	if l.IdleTimeout <= 0 {
		errs = append(errs, &FieldError{"limits.idleTimeout", fmt.Sprintf("%s: must be positive: without it an idle connection holds its place forever", l.IdleTimeout)})
	}
	if l.MaxConnections < 1 {
		errs = append(errs, &FieldError{"limits.maxConnections", fmt.Sprintf("%d: want at least 1", l.MaxConnections)})
	}
	return errs
}

// gate answers an HTTP error, never an admission verdict, when the webhook
// cannot decide: 503 before a policy is loaded and while shutting down, 429
// when too many reviews are in flight. The API server counts any of them as
// a failed call, so the webhook's failurePolicy decides, which an answer of
// "denied" would not let it do.
type gate struct {
	policyLoaded func() bool
	// draining closes when the shutdown delay begins, stopping when it
	// ends and the server stops.
	draining <-chan struct{}
	stopping <-chan struct{}
	limits   Limits
	reviews  *semaphore.Weighted
	bytes    *semaphore.Weighted
	metrics  *Metrics
}

func newGate(l Limits, policyLoaded func() bool, stopping <-chan struct{}, m *Metrics) *gate {
	return &gate{policyLoaded: policyLoaded, stopping: stopping, limits: l,
		reviews: semaphore.NewWeighted(l.MaxReviews), bytes: semaphore.NewWeighted(l.MaxReviewBytes), metrics: m}
}

// wrap puts the gate in front of next.
func (g *gate) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if closed(g.draining) {
			// The API server reuses idle keep-alive connections and never
			// retries a webhook call, so one written onto a connection as
			// the stopping server closes it fails. While draining, every
			// answer retires its connection instead, so none is left
			// idle to close.
			w.Header().Set("Connection", "close")
		}
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
		// The body is read before anything else is reserved, its bytes
		// counted against MaxReviewBytes as they arrive, under a deadline: a
		// connection that declares a large body and sends none holds
		// nothing, and one that stalls is cut off (a declared length was
		// reserved up front before, so three idle connections could turn
		// every review away for as long as they stayed open).
		rc := http.NewResponseController(w)
		if g.limits.BodyRead > 0 {
			_ = rc.SetReadDeadline(time.Now().Add(g.limits.BodyRead)) // unsupported only by tests' recorders
		}
		body, held, err := g.readBody(r)
		defer g.bytes.Release(held)
		switch {
		case errors.Is(err, errOverloaded):
			g.refuse(w, http.StatusTooManyRequests, "overloaded", "gpuguard webhook has too many review bytes in flight")
			return
		case err != nil:
			g.refuse(w, http.StatusRequestTimeout, "slow-body", "admission review: reading the body: "+err.Error())
			return
		}
		_ = rc.SetReadDeadline(time.Time{})
		r.Body = bufferedBody{Reader: bytes.NewReader(body), data: body}
		release, ok := g.acquire(r.Context())
		if !ok {
			g.refuse(w, http.StatusTooManyRequests, "overloaded", "gpuguard webhook has too many reviews in flight")
			return
		}
		defer release()
		next.ServeHTTP(w, r)
	})
}

// closed says whether c is closed; a nil channel never is.
func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// bufferedBody is a review body the gate has read whole: requireRequest
// takes its bytes as they are instead of copying them again.
type bufferedBody struct {
	*bytes.Reader
	data []byte
}

func (bufferedBody) Close() error { return nil }

// errOverloaded: the bytes in flight are at MaxReviewBytes.
var errOverloaded = errors.New("too many review bytes in flight")

// readBody reads a review's body, at most one byte past maxReviewBytes
// (requireRequest answers the rest), acquiring each chunk's bytes as it
// arrives and waiting up to limits.Wait for room; held is what it
// acquired, to be released once the review is answered.
func (g *gate) readBody(r *http.Request) (body []byte, held int64, err error) {
	if r.Body == nil {
		return nil, 0, nil
	}
	defer r.Body.Close()
	src := io.LimitReader(r.Body, maxReviewBytes+1)
	chunk := make([]byte, 32<<10)
	for {
		n, rerr := src.Read(chunk)
		if n > 0 {
			if !g.bytes.TryAcquire(int64(n)) {
				ctx, cancel := context.WithTimeout(r.Context(), g.limits.Wait)
				aerr := g.bytes.Acquire(ctx, int64(n))
				cancel()
				if aerr != nil {
					return nil, held, errOverloaded
				}
			}
			held += int64(n)
			body = append(body, chunk[:n]...)
		}
		switch {
		case rerr == io.EOF && len(body) > maxReviewBytes:
			return body, held, drainOversized(r.Body)
		case rerr == io.EOF:
			return body, held, nil
		case rerr != nil:
			return nil, held, rerr
		}
	}
}

// maxDrainBytes is how much of an oversized body the gate reads and
// throws away so that its sender, still writing, sees the 413 instead of a
// reset connection: closing a connection with unread bytes resets it, and
// the reset discards an answer the sender has not read yet. A body larger
// still is cut off; all of it is read under the body deadline and none
// of it is kept.
const maxDrainBytes = 32 << 20

// drainOversized reads what is left of an oversized body, up to
// maxDrainBytes, into nothing.
func drainOversized(body io.Reader) error {
	if _, err := io.CopyN(io.Discard, body, maxDrainBytes); err != nil && err != io.EOF {
		return err
	}
	return nil
}

// acquire waits up to limits.Wait for room for one more review.
func (g *gate) acquire(ctx context.Context) (release func(), ok bool) {
	ctx, cancel := context.WithTimeout(ctx, g.limits.Wait)
	defer cancel()
	if err := g.reviews.Acquire(ctx, 1); err != nil {
		return nil, false
	}
	return func() { g.reviews.Release(1) }, true
}

func (g *gate) refuse(w http.ResponseWriter, status int, reason, msg string) {
	if g.metrics != nil {
		g.metrics.Refused.WithLabelValues(reason).Inc()
	}
	w.Header().Set("Retry-After", strconv.Itoa(1))
	http.Error(w, msg, status)
}
