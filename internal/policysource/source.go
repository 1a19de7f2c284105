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
	metrics Metrics
	log     logr.Logger
	// loadedOnce is closed when the first policy is in force.
	loadedOnce chan struct{}
	closeOnce  sync.Once
}

type activePolicy struct {
	engine *policy.Engine
	hash   string
	source string
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
	p, err := config.Load(source, data)
	if err == nil {
		var e *policy.Engine
		if e, err = policy.New(p); err == nil {
			return s.install(source, data, e), nil
		}
	}
	s.metrics.Reloads.WithLabelValues("error").Inc()
	s.log.Error(err, "policy not loaded; the last good policy stays in force", "source", source, "policyHash", s.Hash())
	return false, err
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
