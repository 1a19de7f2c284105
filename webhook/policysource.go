package webhook

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/go-logr/logr"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/policy"
)

// EngineSource gives the engine of the policy in force, or nil before one is loaded.
type EngineSource interface {
	Engine() *policy.Engine
}

// PolicySource holds the policy in force. A load that fails changes nothing: the last
// good policy stays.
type PolicySource struct {
	current atomic.Pointer[activePolicy]
	metrics *Metrics
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

// NewPolicySource makes an empty source; Ready fails until Load succeeds.
func NewPolicySource(m *Metrics, log logr.Logger) *PolicySource {
	return &PolicySource{metrics: m, log: log, loadedOnce: make(chan struct{})}
}

// loaded says whether a policy is in force.
func (s *PolicySource) loaded() bool { return s.current.Load() != nil }

// Engine returns the engine of the policy in force, or nil.
func (s *PolicySource) Engine() *policy.Engine {
	if a := s.current.Load(); a != nil {
		return a.engine
	}
	return nil
}

// Hash identifies the policy in force ("" before one is loaded).
func (s *PolicySource) Hash() string {
	if a := s.current.Load(); a != nil {
		return a.hash
	}
	return ""
}

// Load parses a policy document (or a ConfigMap manifest holding one) and puts it in
// force. It reports whether the policy changed.
func (s *PolicySource) Load(source string, data []byte) (changed bool, err error) {
	p, err := config.Load(source, data)
	if err == nil {
		var e *policy.Engine
		if e, err = policy.New(p); err == nil {
			return s.install(source, data, e), nil
		}
	}
	s.metrics.PolicyReloads.WithLabelValues("error").Inc()
	s.log.Error(err, "policy not loaded; the last good policy stays in force", "source", source, "policyHash", s.Hash())
	return false, err
}

func (s *PolicySource) install(source string, data []byte, e *policy.Engine) bool {
	sum := sha256.Sum256(data)
	hash := hex.EncodeToString(sum[:])[:16]
	old := s.current.Load()
	if old != nil && old.hash == hash {
		return false
	}
	s.current.Store(&activePolicy{engine: e, hash: hash, source: source})
	s.closeOnce.Do(func() { close(s.loadedOnce) })
	s.metrics.PolicyReloads.WithLabelValues("success").Inc()
	s.metrics.PolicyInfo.Reset()
	s.metrics.PolicyInfo.WithLabelValues(hash, string(e.Policy().Spec.Mode)).Set(1)
	s.log.Info("policy loaded", "source", source, "policyHash", hash, "mode", e.Policy().Spec.Mode)
	for _, advice := range config.Advice(e.Policy()) {
		s.log.Info("policy advice", "advice", advice)
	}
	return true
}

var errNoPolicy = errors.New("no valid gpuguard policy is loaded yet")

// Ready is a readiness check: it fails until a valid policy is loaded.
func (s *PolicySource) Ready(*http.Request) error {
	if s.Engine() == nil {
		return errNoPolicy
	}
	return nil
}
