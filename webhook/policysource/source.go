// Package policysource holds the gpuguard policy in force and keeps it in step
// with its ConfigMap: a load that fails changes nothing, the last good policy
// stays, and an Event on the ConfigMap says why.
package policysource

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/policy"
)

// Metrics are the collectors a Source updates.
type Metrics struct {
	// Reloads counts loads by result: success or error.
	Reloads *prometheus.CounterVec
	// Info is 1 for the hash and mode of the policy in force.
	Info *prometheus.GaugeVec
}

// Source holds the policy in force. A load that fails changes nothing: the last
// good policy stays.
type Source struct {
	current atomic.Pointer[activePolicy]
	// loaded is the last document that loaded, kept to put it in force again
	// when the profile changes.
	loaded atomic.Pointer[loadedPolicy]
	// injectionOff is the hardened-cluster profile: the policy is put in
	// force without its void injection (SetInjectionOff).
	injectionOff atomic.Bool
	// mu orders rebuilds: a load and a profile change never interleave.
	mu      sync.Mutex
	metrics Metrics
	log     logr.Logger
	// loadedOnce is closed when the first policy is in force.
	loadedOnce chan struct{}
	closeOnce  sync.Once
	// require refuses policies this webhook cannot put safely in force,
	// whatever their validity (SetRequirement).
	require func(*config.Policy) error
}

// SetRequirement makes Load refuse, as invalid, a policy for which check
// returns an error: the last good policy stays in force. Set it before the
// first Load.
func (s *Source) SetRequirement(check func(*config.Policy) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.require = check
}

type activePolicy struct {
	engine *policy.Engine
	hash   string
	source string
}

type loadedPolicy struct {
	source string
	data   []byte
	policy *config.Policy
}

// New makes an empty source; Ready fails until Load succeeds.
func New(m Metrics, log logr.Logger) *Source {
	return &Source{metrics: m, log: log, loadedOnce: make(chan struct{})}
}

// Loaded says whether a policy is in force.
func (s *Source) Loaded() bool { return s.current.Load() != nil }

// FirstLoad is closed when the first policy is in force.
func (s *Source) FirstLoad() <-chan struct{} { return s.loadedOnce }

// Engine returns the engine of the policy in force, or nil.
func (s *Source) Engine() *policy.Engine {
	if a := s.current.Load(); a != nil {
		return a.engine
	}
	return nil
}

// Hash identifies the policy in force ("" before one is loaded).
func (s *Source) Hash() string {
	if a := s.current.Load(); a != nil {
		return a.hash
	}
	return ""
}

// Load parses a policy document (or a ConfigMap manifest holding one) and puts it in
// force. It reports whether the policy changed.
func (s *Source) Load(source string, data []byte) (changed bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, err := config.Load(source, data)
	if err == nil && s.require != nil {
		err = s.require(p)
	}
	if err == nil {
		var e *policy.Engine
		inForce, hashed := s.inForce(p, data)
		if e, err = policy.New(inForce); err == nil {
			s.loaded.Store(&loadedPolicy{source: source, data: data, policy: p})
			return s.install(source, hashed, e), nil
		}
	}
	s.metrics.Reloads.WithLabelValues("error").Inc()
	s.log.Error(err, "policy not loaded; the last good policy stays in force", "source", source, "policyHash", s.Hash())
	return false, err
}

// SetInjectionOff turns the hardened-cluster profile on or off: while on,
// the loaded policy is in force without its void injection (injectVoid
// false), for clusters whose GPU nodes all refuse device requests in the
// environment. It reports whether the policy in force changed.
func (s *Source) SetInjectionOff(off bool) (changed bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.injectionOff.Swap(off) == off {
		return false, nil
	}
	l := s.loaded.Load()
	if l == nil {
		return false, nil
	}
	inForce, hashed := s.inForce(l.policy, l.data)
	e, err := policy.New(inForce)
	if err != nil {
		return false, err
	}
	s.log.Info("hardened-cluster profile changed", "injectionOff", off)
	return s.install(l.source, hashed, e), nil
}

// InjectionOff says whether the hardened-cluster profile is on.
func (s *Source) InjectionOff() bool { return s.injectionOff.Load() }

// inForce is the loaded policy as put in force under the current profile,
// and the bytes its hash is taken from: the document, marked when the
// profile changed it, so that a profile change is a policy change for
// everything that follows the hash (the backstop, the pre-filter, metrics).
func (s *Source) inForce(p *config.Policy, data []byte) (*config.Policy, []byte) {
	if !s.injectionOff.Load() || !p.Spec.InjectVoid {
		return p, data
	}
	off := *p
	off.Spec.InjectVoid = false
	return &off, append(append([]byte(nil), data...), "\n# hardened-cluster profile: injectVoid off\n"...)
}

func (s *Source) install(source string, data []byte, e *policy.Engine) bool {
	sum := sha256.Sum256(data)
	hash := hex.EncodeToString(sum[:])[:16]
	old := s.current.Load()
	if old != nil && old.hash == hash {
		return false
	}
	s.current.Store(&activePolicy{engine: e, hash: hash, source: source})
	s.closeOnce.Do(func() { close(s.loadedOnce) })
	s.metrics.Reloads.WithLabelValues("success").Inc()
	s.metrics.Info.Reset()
	s.metrics.Info.WithLabelValues(hash, string(e.Policy().Spec.Mode)).Set(1)
	s.log.Info("policy loaded", "source", source, "policyHash", hash, "mode", e.Policy().Spec.Mode)
	for _, advice := range config.Advice(e.Policy()) {
		s.log.Info("policy advice", "advice", advice)
	}
	return true
}

// ErrNoPolicy is the readiness error before a policy is loaded.
var ErrNoPolicy = errors.New("no valid gpuguard policy is loaded yet")

// Ready is a readiness check: it fails until a valid policy is loaded.
func (s *Source) Ready(*http.Request) error {
	if s.Engine() == nil {
		return ErrNoPolicy
	}
	return nil
}
