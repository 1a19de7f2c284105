//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/gpuguard/gpuguard/cel"
	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/e2e/framework"
	"github.com/gpuguard/gpuguard/e2e/framework/controlplane"
	"github.com/gpuguard/gpuguard/internal/manifest"
	"github.com/gpuguard/gpuguard/internal/wellknown"
	"github.com/gpuguard/gpuguard/policy"
	"github.com/gpuguard/gpuguard/testsupport/fixtures"
)

// fixture is a case of the engine's fixtures (policy/testdata).
type fixture = fixtures.Fixture

// expectedRules are a fail fixture's rules, sorted, once each.
func expectedRules(f *fixture) []string {
	var want []string
	for _, r := range f.Expect {
		want = append(want, string(r))
	}
	slices.Sort(want)
	return slices.Compact(want)
}

var resources = map[string]schema.GroupVersionResource{
	"Pod": {Version: "v1", Resource: "pods"}, "PodTemplate": {Version: "v1", Resource: "podtemplates"},
	"ReplicationController": {Version: "v1", Resource: "replicationcontrollers"},
	"Deployment":            {Group: "apps", Version: "v1", Resource: "deployments"},
	"ReplicaSet":            {Group: "apps", Version: "v1", Resource: "replicasets"},
	"StatefulSet":           {Group: "apps", Version: "v1", Resource: "statefulsets"},
	"DaemonSet":             {Group: "apps", Version: "v1", Resource: "daemonsets"},
	"Job":                   {Group: "batch", Version: "v1", Resource: "jobs"},
	"CronJob":               {Group: "batch", Version: "v1", Resource: "cronjobs"},
}

// fixtureObject decodes a fixture's object, typed for the engine and
// unstructured, in ns, for the dynamic client.
func fixtureObject(t *testing.T, f *fixture, ns string) (runtime.Object, *unstructured.Unstructured) {
	t.Helper()
	typed, err := manifest.DecodeObject(f.Object)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{}
	if u.Object, err = runtime.DefaultUnstructuredConverter.ToUnstructured(typed); err != nil {
		t.Fatal(err)
	}
	u.SetNamespace(ns)
	return typed, u
}

// namedFixture is a fixture with its name, such as fail/device-env-nongpu-all.
type namedFixture struct {
	name string
	*fixture
}

// plainFixtures loads the engine's fixtures that are plain CREATEs under the
// default policy, as a tenant would send them.
func plainFixtures(t *testing.T) []namedFixture {
	return loadFixtures(t, "plain", (*fixture).Plain, 50)
}

// loadFixtures loads the engine's fixtures that keep accepts, named like
// fail/device-env-nongpu-all; fewer than atLeast fails the test, so that a
// moved directory cannot make a suite pass on nothing.
func loadFixtures(t *testing.T, kind string, keep func(*fixture) bool, atLeast int) []namedFixture {
	t.Helper()
	all, err := fixtures.All(filepath.Join("..", "policy", "testdata"))
	if err != nil {
		t.Fatal(err)
	}
	var out []namedFixture
	for _, f := range all {
		if keep(f) {
			out = append(out, namedFixture{f.Name, f})
		}
	}
	if len(out) < atLeast {
		t.Fatalf("only %d %s fixtures found", len(out), kind)
	}
	return out
}

// clientAndEngine are a dynamic client of the suite's API server and the engine
// with the default policy.
func clientAndEngine(t *testing.T) (dynamic.Interface, *policy.Engine) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(s.cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	engine, err := policy.New(config.Default())
	if err != nil {
		t.Fatal(err)
	}
	return dyn, engine
}

// TestThreatModelFixtures sends every plain CREATE fixture of the engine's test
// suite through the real API server: fail fixtures must be denied naming exactly
// their rules, and pass fixtures stored with the env the engine computes.
func TestThreatModelFixtures(t *testing.T) {
	dyn, engine := clientAndEngine(t)
	for _, f := range plainFixtures(t) {
		t.Run(f.name, func(t *testing.T) {
			runFixture(t, dyn, engine, f.fixture, strings.HasPrefix(f.name, "fail/"), envEqual)
		})
	}
}

// TestThreatModelFixturesDefaultInstall sends the same fixtures through what
// helm install gives: the CEL backstop, and the webhooks behind the
// pre-filter, so that most pass fixtures get their void from the backstop
// and reach no webhook, and every fail fixture still gets the webhook's
// denial naming exactly its rules.
func TestThreatModelFixturesDefaultInstall(t *testing.T) {
	ctx := context.Background()
	backstop, err := cel.Render(config.Default(), cel.Options{Name: "gpuguard-default-install",
		ExcludedNamespaces: []string{releaseNS, excludedNS, selfManagedNS, chartNamespace}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := removePolicies(ctx, backstop); err != nil {
			t.Error(err)
		}
		if err := waitBackstopGone(ctx); err != nil {
			t.Error(err)
		}
		if err := s.Configs.Install(ctx, s.cp.Client); err != nil {
			t.Error(err)
		}
		if err := s.waitEnforcing(ctx); err != nil {
			t.Error(err)
		}
	}()
	if err := installPolicies(ctx, backstop, backstop); err != nil {
		t.Fatal(err)
	}
	if err := filteredConfigs(t, config.Default()).Install(ctx, s.cp.Client); err != nil {
		t.Fatal(err)
	}
	pods := s.cp.Client.CoreV1().Pods(enforceNS)
	err = framework.Poll(ctx, 2*time.Minute, func() (bool, error) {
		p, err := pods.Create(ctx, plainPod("probe"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil || lastEnv(p.Spec.Containers[0], "NVIDIA_VISIBLE_DEVICES") != "void" {
			return false, nil
		}
		_, err = pods.Create(ctx, withEnv(plainPod("leak"), allGPUs), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "gpuguard denied"), nil
	})
	if err != nil {
		t.Fatalf("the default install does not act: %v", err)
	}
	dyn, engine := clientAndEngine(t)
	for _, f := range plainFixtures(t) {
		t.Run(f.name, func(t *testing.T) {
			runFixture(t, dyn, engine, f.fixture, strings.HasPrefix(f.name, "fail/"), sameDevices)
		})
	}
}

// runFixture sends one fixture; a pass fixture's containers must be stored
// with the env the engine computes, as same says.
func runFixture(t *testing.T, dyn dynamic.Interface, engine *policy.Engine, f *fixture, fail bool, same func(a, b []corev1.EnvVar) bool) {
	ctx := context.Background()
	// A namespace of its own, so that the ConfigMaps of one fixture (and the
	// webhook's short cache of them) do not leak into another.
	ns := fmt.Sprintf("fx-%08x", crc32.ChecksumIEEE([]byte(t.Name())))
	if err := controlplane.EnsureNamespace(ctx, s.cp, ns, nil); err != nil {
		t.Fatal(err)
	}
	for _, cm := range f.ConfigMaps {
		cm.Namespace = ns
		if _, err := s.cp.Client.CoreV1().ConfigMaps(ns).Create(ctx, &cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range f.Nodes {
		if err := ensureNode(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	typed, u := fixtureObject(t, f, ns)
	gvr := resources[u.GetKind()]
	created, err := dyn.Resource(gvr).Namespace(ns).Create(ctx, u, metav1.CreateOptions{})
	if fail {
		if got, want := deniedRules(t, err), expectedRules(f); !slices.Equal(got, want) {
			t.Errorf("the API server denied with rules %v, the fixture expects %v", got, want)
		}
		return
	}
	if apierrors.IsInvalid(err) {
		t.Skipf("not a valid object for the API server, whatever gpuguard says: %v", err)
	}
	if err != nil {
		t.Fatalf("a pass fixture was refused: %v", err)
	}
	pod, ok := typed.(*corev1.Pod)
	if !ok {
		return
	}
	want, err := engine.Admit(ctx, policy.Request{Operation: admissionv1.Create, Namespace: ns, Object: pod, Nodes: fixtures.Nodes(f.Nodes)})
	if err != nil {
		t.Fatal(err)
	}
	stored, expected := storedAndExpected(t, pod, want, created)
	for i, c := range stored {
		if !same(c.Env, expected[i].Env) {
			t.Errorf("container %s stored with env %v, the engine computes %v", c.Name, c.Env, expected[i].Env)
		}
	}
}

// ensureNode creates a fixture's Node, or finds it, with the fixture's
// allocatable in its status: fixtures that name one node give it the same
// resources.
func ensureNode(ctx context.Context, n corev1.Node) error {
	nodes := s.cp.Client.CoreV1().Nodes()
	created, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		created, err = nodes.Get(ctx, n.Name, metav1.GetOptions{})
	}
	if err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	created.Status.Allocatable = n.Status.Allocatable
	created.Status.Capacity = n.Status.Allocatable
	if _, err := nodes.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("node %s status: %w", n.Name, err)
	}
	return nil
}

// storedAndExpected lists the containers (init containers first) of the pod the API
// server stored and of the pod the engine's patch makes, in the same order.
func storedAndExpected(t *testing.T, pod *corev1.Pod, want policy.Result, created *unstructured.Unstructured) (stored, expected []corev1.Container) {
	patched, err := policy.ApplyPatch(pod, want.Patch)
	if err != nil {
		t.Fatal(err)
	}
	s := &corev1.Pod{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(created.Object, s); err != nil {
		t.Fatal(err)
	}
	e := patched.(*corev1.Pod)
	// The groups pin-parent-groups sets are the same too.
	if g, w := framework.PinnedGroups(s), framework.PinnedGroups(e); g != w {
		t.Errorf("stored with supplementalGroupsPolicy and runAsGroups %s, the engine computes %s", g, w)
	}
	// And the annotation naming the containers given void.
	if g, w := s.Annotations[wellknown.VoidAnnotation], e.Annotations[wellknown.VoidAnnotation]; g != w {
		t.Errorf("stored with %s=%q, the engine computes %q", wellknown.VoidAnnotation, g, w)
	}
	return append(s.Spec.InitContainers, s.Spec.Containers...), append(e.Spec.InitContainers, e.Spec.Containers...)
}

// sameDevices: the same entries but the device variable's, and the same
// effective NVIDIA_VISIBLE_DEVICES. The backstop appends void after
// NVIDIA_VISIBLE_DEVICES=none where the webhook rewrites it in place (a
// declared gap, docs/cel-backstop.md): the toolkit reads the same.
func sameDevices(a, b []corev1.EnvVar) bool {
	others := func(env []corev1.EnvVar) []corev1.EnvVar {
		return slices.DeleteFunc(slices.Clone(env), func(e corev1.EnvVar) bool { return e.Name == "NVIDIA_VISIBLE_DEVICES" })
	}
	last := func(env []corev1.EnvVar) string {
		return framework.LastEnv(corev1.Container{Env: env}, "NVIDIA_VISIBLE_DEVICES")
	}
	return envEqual(others(a), others(b)) && last(a) == last(b)
}

func envEqual(a, b []corev1.EnvVar) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}
