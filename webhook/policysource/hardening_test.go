package policysource

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/internal/wellknown"
	"github.com/gpuguard/gpuguard/webhook/hardening"
)

// fakeHardening answers AllHardened as told.
type fakeHardening struct {
	hardened bool
	until    time.Time
	err      error
}

func (f *fakeHardening) AllHardened(context.Context) (hardening.Verdict, error) {
	return hardening.Verdict{Hardened: f.hardened, Why: "told so", Until: f.until}, f.err
}

// TestHardenedProfileFollowsTheNodes: with every GPU node hardened, the
// policy in force has no void injection (a new hash, so the backstop and
// the pre-filter are applied again); when one is not, or the nodes cannot
// be read, the injection is back; each change is an Event.
func TestHardenedProfileFollowsTheNodes(t *testing.T) {
	r, c, rec := newReconciler(false)
	nodes := &fakeHardening{}
	r.Hardening = nodes
	r.InjectionOff = prometheus.NewGauge(prometheus.GaugeOpts{Name: "off"})
	var applied []bool
	r.Apply = func(_ context.Context, p *config.Policy) error {
		applied = append(applied, p.Spec.InjectVoid)
		return nil
	}
	writePolicyConfigMap(t, c, string(config.DefaultYAML()))
	r.reconcileOnce(t)
	expectEvent(t, rec, wellknown.ReasonPolicyLoaded)
	injecting := r.Source.Hash()
	if !r.Source.Engine().Policy().Spec.InjectVoid || testutil.ToFloat64(r.InjectionOff) != 0 {
		t.Fatal("with no GPU node hardened, the policy's injection must be in force")
	}
	step := func(hardened bool, err error, wantInjection bool) {
		t.Helper()
		nodes.hardened, nodes.err = hardened, err
		_, rerr := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: hardeningKey})
		if !errors.Is(rerr, err) {
			t.Fatalf("reconcile: %v, want %v", rerr, err)
		}
		if got := r.Source.Engine().Policy().Spec.InjectVoid; got != wantInjection {
			t.Fatalf("injectVoid in force %v, want %v", got, wantInjection)
		}
		expectEvent(t, rec, wellknown.ReasonInjectionProfile)
	}
	step(true, nil, false)
	if r.Source.Hash() == injecting || testutil.ToFloat64(r.InjectionOff) != 1 {
		t.Error("the profile must change the hash and the gauge")
	}
	step(false, nil, true)
	if r.Source.Hash() != injecting {
		t.Error("back on, the policy in force must be the loaded one")
	}
	step(true, nil, false)
	step(true, errors.New("nodes cannot be listed"), true)
	if len(applied) < 4 || applied[0] != true || applied[1] != false || applied[2] != true {
		t.Errorf("applies saw injectVoid %v, want true, false, true, false, ...", applied)
	}
}

// TestRecheckWhenALeaseGoesStale: while the profile rests on Leases, the
// hardening is read again when the first of them would go stale, with no
// event needed (a cut watch sees no renewal), and at least every
// leaseRecheck; without Leases followed it is not read on a timer.
func TestRecheckWhenALeaseGoesStale(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name           string
		leaseNamespace string
		until          time.Time
		want           time.Duration
	}{
		{"a Lease stale in 5s", "gpuguard-system", now.Add(5 * time.Second), 5*time.Second + staleMargin},
		{"a Lease stale in a minute", "gpuguard-system", now.Add(time.Minute), leaseRecheck},
		{"a Lease stale already", "gpuguard-system", now.Add(-time.Second), staleMargin},
		{"not hardened", "gpuguard-system", time.Time{}, leaseRecheck},
		{"no Leases followed", "", time.Time{}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, c, _ := newReconciler(false)
			r.Hardening = &fakeHardening{hardened: !tc.until.IsZero(), until: tc.until}
			r.InjectionOff = prometheus.NewGauge(prometheus.GaugeOpts{Name: "off"})
			r.LeaseNamespace = tc.leaseNamespace
			r.Now = func() time.Time { return now }
			writePolicyConfigMap(t, c, string(config.DefaultYAML()))
			r.reconcileOnce(t)
			got, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: hardeningKey})
			if err != nil {
				t.Fatal(err)
			}
			if got.RequeueAfter != tc.want {
				t.Errorf("read again after %v, want %v", got.RequeueAfter, tc.want)
			}
		})
	}
}

// TestNeverIsStatic: --inject-void=never puts every policy loaded later in
// force without its injection.
func TestNeverIsStatic(t *testing.T) {
	s := New(testMetrics(), logr.Discard())
	if _, err := s.SetInjectionOff(true); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load("default", config.DefaultYAML()); err != nil {
		t.Fatal(err)
	}
	if s.Engine().Policy().Spec.InjectVoid {
		t.Error("the policy in force injects void")
	}
}
