//go:build e2e

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/gpuguard/gpuguard/e2e/framework/controlplane"
)

// chartNamespace is the release namespace of the chart's golden renderings.
const chartNamespace = "gpuguard-system"

// TestChartObjectsPassServerSideDryRun sends every object of every golden rendering
// of the Helm chart (charts/testdata: defaults, each certificate mode, agent off,
// GPU Operator preset, custom policies, extra system namespaces, observability),
// hooks included, to the real API server as a server-side dry-run create with strict
// field validation, in the release namespace, which the suite's installation
// leaves unguarded as the chart does. Kinds this API server does not serve (cert-manager,
// Prometheus Operator) are reported, not sent.
func TestChartObjectsPassServerSideDryRun(t *testing.T) {
	ctx := context.Background()
	if err := controlplane.EnsureNamespace(ctx, s.cp, chartNamespace, nil); err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(s.cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(s.cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	goldens, _ := filepath.Glob(filepath.Join("..", "charts", "testdata", "*.yaml"))
	if len(goldens) == 0 {
		t.Fatal("no golden renderings in charts/testdata")
	}
	sent := 0
	for _, path := range goldens {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(strings.TrimSuffix(filepath.Base(path), ".yaml"), func(t *testing.T) {
			for _, doc := range strings.Split(string(data), "\n---\n") {
				u := &unstructured.Unstructured{}
				if err := sigsyaml.Unmarshal([]byte(doc), &u.Object); err != nil {
					t.Fatalf("a rendered document does not parse: %v\n%s", err, doc)
				}
				if len(u.Object) == 0 {
					continue // comments only, such as NOTES.txt
				}
				gvk := u.GroupVersionKind()
				mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
				if meta.IsNoMatchError(err) {
					t.Logf("not served by this API server, not sent: %s %s", gvk, u.GetName())
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				ri := dyn.Resource(mapping.Resource)
				var target dynamic.ResourceInterface = ri
				if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
					if u.GetNamespace() == "" {
						u.SetNamespace(chartNamespace)
					}
					target = ri.Namespace(u.GetNamespace())
				}
				create := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: "Strict"}
				_, err = target.Create(ctx, u, create)
				if apierrors.IsAlreadyExists(err) {
					// The suite's own installation holds that name (cluster-scoped
					// objects): judge the same object under another name.
					u.SetName(u.GetName() + "-dry-run")
					_, err = target.Create(ctx, u, create)
				}
				if apierrors.IsNotFound(err) && u.GetNamespace() != "" && u.GetNamespace() != chartNamespace {
					t.Logf("%s %s targets namespace %s, which the test does not create", gvk.Kind, u.GetName(), u.GetNamespace())
					continue
				}
				if err != nil {
					t.Errorf("the API server refused %s %s: %v", gvk.Kind, u.GetName(), err)
				}
				sent++
			}
		})
	}
	if sent < 50 {
		t.Errorf("only %d objects were sent to the API server", sent)
	}
}
