package celcost_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/admission"

	"github.com/gpuguard/gpuguard/cel"
	"github.com/gpuguard/gpuguard/cel/celcost"
	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/testsupport/fixtures"
)

// TestFixturesFarWithinBudget measures every fixture's request: each part
// that runs must stay under a hundredth of its budget. Fixtures are small
// pods, so a part near that is an expression that grew out of proportion
// (a comprehension nested where it need not be).
func TestFixturesFarWithinBudget(t *testing.T) {
	all, err := fixtures.All("../../policy/testdata")
	if err != nil {
		t.Fatal(err)
	}
	meters := map[string]*celcost.Meter{}
	most := map[string]int64{}
	for _, f := range all {
		p, err := f.PolicyDocument()
		if err != nil {
			t.Fatal(err)
		}
		req, err := f.Request()
		if err != nil {
			t.Fatal(err)
		}
		key, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		m, ok := meters[string(key)]
		if !ok {
			m = meterFor(t, p)
			meters[string(key)] = m
		}
		ns := req.Namespace
		if ns == "" {
			ns = "default"
		}
		costs, err := m.Measure(context.Background(), celcost.Request{Operation: admission.Operation(req.Operation), SubResource: req.SubResource,
			Namespace: ns, Username: req.UserInfo.Username, Object: req.Object, OldObject: req.OldObject})
		if err != nil {
			t.Fatalf("%s: %v", f.Name, err)
		}
		for _, c := range costs {
			if c.Err != nil || c.Cost > c.Budget/100 {
				t.Errorf("%s: %s costs %d of %d (%v)", f.Name, c.Part, c.Cost, c.Budget, c.Err)
			}
			most[c.Part] = max(most[c.Part], c.Cost)
		}
	}
	for part, cost := range most {
		t.Logf("%s: at most %d", part, cost)
	}
}

// TestLargePodWithinBudget: the large reference pod, far past what
// workloads carry, stays under a tenth of each budget, so that no pod is
// refused for what gpuguard's CEL costs.
func TestLargePodWithinBudget(t *testing.T) {
	refs := celcost.References()
	large := refs[len(refs)-1]
	costs, err := meterFor(t, config.Default()).Measure(context.Background(), celcost.Request{Namespace: "default", Object: large.Pod})
	if err != nil {
		t.Fatal(err)
	}
	if len(costs) != 6 {
		t.Fatalf("%d parts measured, want the MAP's two, the VAP's three and the pre-filter: %v", len(costs), costs)
	}
	for _, c := range costs {
		if c.Err != nil || c.Cost > c.Budget/10 {
			t.Errorf("%s costs %d of %d (%v)", c.Part, c.Cost, c.Budget, c.Err)
		}
	}
}

// TestMessagesCostNothing: the API server evaluates every message
// expression on every request that reaches the validations, so the
// backstop's messages must not scan the pod again (shown failing with the
// message expressions that named the offending container).
func TestMessagesCostNothing(t *testing.T) {
	for _, r := range celcost.References() {
		costs, err := meterFor(t, config.Default()).Measure(context.Background(), celcost.Request{Namespace: "default", Object: r.Pod})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range costs {
			if strings.HasSuffix(c.Part, ", message expressions") && (c.Err != nil || c.Cost != 0) {
				t.Errorf("%s pod: %s cost %d (%v)", r.Name, c.Part, c.Cost, c.Err)
			}
		}
	}
}

// TestOverBudgetFails: a part whose expression goes over the API server's
// limit is reported failed, with the API server's reason, not measured.
func TestOverBudgetFails(t *testing.T) {
	p := config.Default()
	policies, err := cel.Render(p, cel.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// Every pair of variables in every pair of containers: quadratic.
	policies.Validating.Spec.Validations = append(policies.Validating.Spec.Validations, admissionregistrationv1.Validation{
		Expression: `object.spec.containers.all(c, c.env.all(e, object.spec.containers.all(d, d.env.all(f, e.name != f.name || e == f))))`})
	m, err := celcost.New(policies, "")
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "wide", Namespace: "default"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app"}}}}
	for i := range 1500 {
		pod.Spec.Containers[0].Env = append(pod.Spec.Containers[0].Env, corev1.EnvVar{Name: fmt.Sprintf("V%d", i), Value: "x"})
	}
	costs, err := m.Measure(context.Background(), celcost.Request{Namespace: "default", Object: pod})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range costs {
		if strings.HasSuffix(c.Part, ", validations") {
			if c.Err == nil || !strings.Contains(c.Err.Error(), "cost") {
				t.Errorf("%s: cost %d, error %v; want a cost limit error", c.Part, c.Cost, c.Err)
			}
			return
		}
	}
	t.Fatalf("no validations measured: %v", costs)
}

func meterFor(t *testing.T, p *config.Policy) *celcost.Meter {
	t.Helper()
	policies, err := cel.Render(p, cel.Options{})
	if err != nil {
		t.Fatal(err)
	}
	prefilter, err := cel.Prefilter(p)
	if err != nil {
		t.Fatal(err)
	}
	m, err := celcost.New(policies, prefilter)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
