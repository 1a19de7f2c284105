package policysource

import (
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpuguard/gpuguard/config"
)

func TestPolicySourceReload(t *testing.T) {
	m := testMetrics()
	s := New(m, logr.Discard())
	if s.Ready(nil) == nil || s.Engine() != nil {
		t.Fatal("an empty source must not be ready")
	}
	warn := []byte("apiVersion: gpuguard.io/v1alpha1\nkind: GPUGuardPolicy\nspec:\n  mode: warn\n")
	if changed, err := s.Load("v1", warn); err != nil || !changed {
		t.Fatalf("first load: changed=%v err=%v", changed, err)
	}
	if s.Ready(nil) != nil || s.Engine().Policy().Spec.Mode != config.ModeWarn {
		t.Fatal("a loaded source must be ready with the loaded policy")
	}
	first := s.Hash()

	if changed, err := s.Load("v1 again", warn); err != nil || changed {
		t.Errorf("the same document again must change nothing: changed=%v err=%v", changed, err)
	}

	bad := []byte("apiVersion: gpuguard.io/v1alpha1\nkind: GPUGuardPolicy\nspec:\n  mode: loud\n")
	_, err := s.Load("v2", bad)
	if err == nil || !strings.Contains(err.Error(), "v2:4: spec.mode") {
		t.Fatalf("a bad edit must fail with its line: %v", err)
	}
	if s.Hash() != first || s.Engine().Policy().Spec.Mode != config.ModeWarn {
		t.Error("a bad edit must leave the last good policy in force")
	}

	if changed, err := s.Load("v3", config.DefaultYAML()); err != nil || !changed || s.Hash() == first {
		t.Errorf("a good edit must take over: changed=%v err=%v", changed, err)
	}
	if got := testutil.ToFloat64(m.Reloads.WithLabelValues("success")); got != 2 {
		t.Errorf("successful reloads = %v, want 2", got)
	}
	if got := testutil.ToFloat64(m.Reloads.WithLabelValues("error")); got != 1 {
		t.Errorf("failed reloads = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.Info.WithLabelValues(s.Hash(), "enforce")); got != 1 {
		t.Errorf("policy info for the policy in force = %v, want 1", got)
	}
}

func testMetrics() Metrics {
	return Metrics{
		Reloads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "reloads"}, []string{"result"}),
		Info:    prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "info"}, []string{"hash", "mode"}),
	}
}
