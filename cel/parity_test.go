package cel_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apiserver/pkg/admission"

	"github.com/gpuguard/gpuguard/cel"
	"github.com/gpuguard/gpuguard/cel/celeval"
	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/internal/wellknown"
	"github.com/gpuguard/gpuguard/policy"
	"github.com/gpuguard/gpuguard/testsupport/fixtures"
)

// TestInProcessParity evaluates the CEL backstop rendered from each
// fixture's policy with the API server's own admission libraries, and
// holds it against the engine on every fixture: the backstop never denies
// what the engine allows; what the engine denies, the backstop denies by
// the same rules, unless a declared gap leaves it to the webhook; and a pod
// both admit ends up with the same effective device variables. The e2e
// suite proves the same against a real API server for the plain fixtures.
func TestInProcessParity(t *testing.T) {
	all, err := fixtures.All("../policy/testdata")
	if err != nil {
		t.Fatal(err)
	}
	judged := 0
	for _, f := range all {
		t.Run(f.Name, func(t *testing.T) {
			if checkParity(t, f) {
				judged++
			}
		})
	}
	t.Logf("%d of %d fixtures judged by the backstop, the rest left to the webhook by a declared gap", judged, len(all))
	if flag.Lookup("test.run").Value.String() == "" && judged < len(all)/2 {
		t.Errorf("only %d of %d fixtures were judged", judged, len(all))
	}
}

// checkParity runs one fixture; false means the backstop has nothing to
// judge in it (a declared gap covers the whole request).
func checkParity(t *testing.T, f *fixtures.Fixture) bool {
	ctx := context.Background()
	p, err := f.PolicyDocument()
	if err != nil {
		t.Fatal(err)
	}
	engine, err := policy.New(p)
	if err != nil {
		t.Fatal(err)
	}
	req, err := f.Request()
	if err != nil {
		t.Fatal(err)
	}
	want, err := f.Evaluate(ctx, engine, req)
	if err != nil {
		t.Fatal(err)
	}
	eval := evaluatorFor(t, p)
	// The API server's request namespace is the object's.
	ns := req.Namespace
	if m, err := meta.Accessor(req.Object); ns == "" && err == nil {
		ns = m.GetNamespace()
	}
	if ns == "" {
		ns = "default"
	}
	got, err := eval.Admit(ctx, celeval.Request{Operation: admission.Operation(req.Operation), SubResource: req.SubResource,
		Namespace: ns, NamespaceLabels: req.NamespaceLabels, Username: req.UserInfo.Username,
		Object: req.Object, OldObject: req.OldObject, SkipMutation: f.Phase == policy.Validating})
	if err != nil {
		t.Fatalf("the backstop failed to evaluate: %v", err)
	}
	return compare(t, p, req, want, enforcedRules(t, f, req, want), got)
}

// enforcedRules are the rules the engine denies by, or would deny by in
// enforce mode: what a backstop warning or audit entry may name.
func enforcedRules(t *testing.T, f *fixtures.Fixture, req policy.Request, want policy.Result) []policy.RuleID {
	if want.Mode == config.ModeEnforce {
		return engineRules(want)
	}
	enforced := *f
	enforced.Policy = maps.Clone(f.Policy)
	if enforced.Policy == nil {
		enforced.Policy = map[string]any{}
	}
	enforced.Policy["mode"] = string(config.ModeEnforce)
	engine, err := enforced.Engine()
	if err != nil {
		t.Fatal(err)
	}
	req.NamespaceLabels = nil
	r, err := enforced.Evaluate(context.Background(), engine, req)
	if err != nil {
		t.Fatal(err)
	}
	return engineRules(r)
}

// wholeRequest marks a request that a declared gap leaves to the webhook
// entirely.
const wholeRequest = "whole-request"

// gapsOf are the declared gaps that apply to a fixture: every rule-level
// gap, and the request-level ones its object, policy and mode call for.
func gapsOf(p *config.Policy, req policy.Request, want policy.Result) map[string]bool {
	gaps := map[string]bool{}
	// Rule-level gaps only: the request-level ones (strip, none-rewrite, …)
	// apply where the request calls for them, below.
	for _, r := range policy.Registry() {
		if r.Gap != "" {
			gaps[string(r.ID)] = true
		}
	}
	// The path rules' gap (and namespace-entry's, on its target's paths) is
	// paths CEL cannot clean; on clean paths their CEL form must agree with
	// the engine exactly.
	if pod, ok := req.Object.(*corev1.Pod); ok && !hasUncleanPath(pod) {
		delete(gaps, string(policy.RuleSensitiveHostPath))
		delete(gaps, string(policy.RuleHostPathLink))
		delete(gaps, string(policy.RuleDeviceListMount))
		delete(gaps, string(policy.RuleNamespaceEntry))
		delete(gaps, string(policy.RuleAddedCapabilities))
	}
	switch req.Object.(type) {
	case *corev1.Pod:
	default:
		// pods-binding and pod-controllers: the backstop reads pods only.
		gaps[wholeRequest] = true
	}
	if slices.ContainsFunc(want.Warnings, func(w policy.Warning) bool { return w.Rule == policy.RuleUnhonouredGPURequest }) {
		// The backstop cannot read Nodes: it judges the container as a GPU
		// container, every rule of it.
		gaps[wholeRequest] = true
	}
	if p.Spec.Action == config.ActionStrip {
		gaps["strip"] = true
	}
	if want.Mode != p.Spec.Mode {
		// namespace-mode: the binding applies the policy's own mode.
		gaps[wholeRequest] = true
	}
	return gaps
}

// evaluators are compiled once per rendering: most fixtures share the
// default policy.
var evaluators = map[string]*celeval.Evaluator{}

func evaluatorFor(t *testing.T, p *config.Policy) *celeval.Evaluator {
	t.Helper()
	rendered, err := cel.Render(p, cel.Options{ExcludedNamespaces: []string{"gpuguard"}})
	if err != nil {
		t.Fatal(err)
	}
	key, err := json.Marshal(rendered)
	if err != nil {
		t.Fatal(err)
	}
	if e, ok := evaluators[string(key)]; ok {
		return e
	}
	e, err := celeval.New(rendered)
	if err != nil {
		t.Fatalf("the rendered backstop does not compile: %v", err)
	}
	evaluators[string(key)] = e
	return e
}

// backstopRule finds the rule in a backstop message ("gpuguard backstop [rule]: ...").
var backstopRule = regexp.MustCompile(`^gpuguard backstop \[([a-z-]+)\]: `)

func compare(t *testing.T, p *config.Policy, req policy.Request, want policy.Result, rules []policy.RuleID, got celeval.Result) bool {
	gaps := gapsOf(p, req, want)
	if gaps[wholeRequest] {
		return false
	}
	for _, msg := range append(got.Denials, got.Warnings...) {
		m := backstopRule.FindStringSubmatch(msg)
		switch {
		case m == nil:
			t.Errorf("the backstop failed to evaluate: %s", msg)
		case gaps[string(m[1])] || gaps["strip"]:
		case !slices.Contains(rules, policy.RuleID(m[1])):
			t.Errorf("the backstop complains by %s, which the engine does not (engine: allowed=%v %v): %s", m[1], want.Allowed, rules, msg)
		}
	}
	if len(got.Denials) == 0 && !want.Allowed {
		for _, v := range want.Violations {
			if !gaps[string(v.Rule)] {
				t.Errorf("the backstop allows what the engine denies by %s, and no gap is declared for it: %s", v.Rule, v.Message)
			}
		}
	}
	if pod, ok := got.Object.(*corev1.Pod); ok && want.Allowed && len(got.Denials) == 0 && !gaps["none-rewrite"] {
		compareDevices(t, req, want, pod)
	}
	return true
}

// engineRules are the rules the engine denies by, or would in enforce mode.
func engineRules(r policy.Result) []policy.RuleID {
	var rules []policy.RuleID
	for _, v := range r.Violations {
		rules = append(rules, v.Rule)
	}
	return append(rules, r.OmittedRules...)
}

// compareDevices: every container ends up with the effective
// NVIDIA_VISIBLE_DEVICES the engine's patch gives it.
func compareDevices(t *testing.T, req policy.Request, want policy.Result, got *corev1.Pod) {
	pod, ok := req.Object.(*corev1.Pod)
	if !ok {
		return
	}
	expected, err := policy.ApplyPatch(pod, want.Patch)
	if err != nil {
		t.Fatal(err)
	}
	wantContainers := append(slices.Clone(expected.(*corev1.Pod).Spec.InitContainers), expected.(*corev1.Pod).Spec.Containers...)
	gotContainers := append(slices.Clone(got.Spec.InitContainers), got.Spec.Containers...)
	for i, c := range gotContainers {
		if g, w := lastEnv(c, "NVIDIA_VISIBLE_DEVICES"), lastEnv(wantContainers[i], "NVIDIA_VISIBLE_DEVICES"); g != w {
			t.Errorf("container %s: NVIDIA_VISIBLE_DEVICES=%s with the backstop, %s with the engine", c.Name, g, w)
		}
		if g, w := runAsGroup(c), runAsGroup(wantContainers[i]); g != w {
			t.Errorf("container %s: runAsGroup %s with the backstop, %s with the engine", c.Name, g, w)
		}
	}
	if g, w := groupsPolicy(got), groupsPolicy(expected.(*corev1.Pod)); g != w {
		t.Errorf("supplementalGroupsPolicy %s with the backstop, %s with the engine", g, w)
	}
	if g, w := voidAnnotation(got), voidAnnotation(expected.(*corev1.Pod)); g != w {
		t.Errorf("annotation %s=%s with the backstop, %s with the engine", wellknown.VoidAnnotation, g, w)
	}
}

// voidAnnotation shows the containers the pod's annotation names as voided,
// or <unset>.
func voidAnnotation(p *corev1.Pod) string {
	if v, ok := p.Annotations[wellknown.VoidAnnotation]; ok {
		return v
	}
	return "<unset>"
}

// runAsGroup and groupsPolicy show what pin-parent-groups sets, or <unset>.
func runAsGroup(c corev1.Container) string {
	if c.SecurityContext == nil || c.SecurityContext.RunAsGroup == nil {
		return "<unset>"
	}
	return fmt.Sprint(*c.SecurityContext.RunAsGroup)
}

func groupsPolicy(p *corev1.Pod) string {
	if p.Spec.SecurityContext == nil || p.Spec.SecurityContext.SupplementalGroupsPolicy == nil {
		return "<unset>"
	}
	return string(*p.Spec.SecurityContext.SupplementalGroupsPolicy)
}

func lastEnv(c corev1.Container, name string) string {
	if v, ok := policy.EffectiveEnv(&c, name); ok {
		return v.Value
	}
	return "<unset>"
}

// FuzzParity feeds arbitrary pods, seeded from the fixtures, to the engine
// and to the backstop under the default policy: the backstop never denies a
// pod the engine admits, denies by the engine's rules only, and leaves every
// container with the same effective device variables; and the pre-filter
// lets past only pods the engine admits unchanged but for the void
// injection (TestPrefilterIsSafe).
func FuzzParity(f *testing.F) {
	all, err := fixtures.All("../policy/testdata")
	if err != nil {
		f.Fatal(err)
	}
	for _, fx := range all {
		if fx.Plain() && strings.Contains(string(fx.Object), `"kind":"Pod"`) {
			f.Add([]byte(fx.Object))
		}
	}
	p := config.Default()
	engine, err := policy.New(p)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		pod := &corev1.Pod{}
		if err := json.Unmarshal(data, pod); err != nil || len(pod.Spec.Containers) == 0 {
			return // the API server refuses a pod without containers before it is stored
		}
		ctx := context.Background()
		req := policy.Request{Operation: "CREATE", Namespace: "default", Object: pod}
		want, err := engine.Admit(ctx, req)
		if err != nil {
			return // a patch the object cannot take: not a pod the API server would store
		}
		got, err := evaluatorFor(t, p).Admit(ctx, celeval.Request{Operation: admission.Create, Namespace: "default", Object: pod.DeepCopy()})
		if err != nil {
			t.Fatalf("the backstop failed to evaluate: %v", err)
		}
		compare(t, p, req, want, engineRules(want), got)
		checkPrefilter(t, p, engine, req, want, true)
	})
}

// hasUncleanPath reports whether a pod has a host or mount path that needs
// path.Clean (what celexpr.Judgeable leaves to the webhook).
func hasUncleanPath(pod *corev1.Pod) bool {
	unclean := func(p string) bool {
		return strings.Contains(p, "//") || strings.Contains(p, "/.") || strings.HasPrefix(p, ".")
	}
	for _, v := range pod.Spec.Volumes {
		if v.HostPath != nil && unclean(v.HostPath.Path) {
			return true
		}
	}
	var mounts []corev1.VolumeMount
	for _, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		mounts = append(mounts, c.VolumeMounts...)
	}
	for _, c := range pod.Spec.EphemeralContainers {
		mounts = append(mounts, c.VolumeMounts...)
	}
	return slices.ContainsFunc(mounts, func(m corev1.VolumeMount) bool { return unclean(m.MountPath) })
}
