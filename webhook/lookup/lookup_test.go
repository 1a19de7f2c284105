package lookup

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpuguard/gpuguard/policy"
)

// hangingReader never answers: a stalled API server.
type hangingReader struct{ client.Reader }

func (hangingReader) Get(ctx context.Context, _ client.ObjectKey, _ client.Object, _ ...client.GetOption) error {
	<-ctx.Done()
	return ctx.Err()
}

// emptyCache has no namespace yet, as for one created a moment ago.
type emptyCache struct{ Informers }

func (emptyCache) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	return apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, "team")
}

// mapReader serves ConfigMaps from a map and counts its reads.
type mapReader struct {
	client.Reader
	data  map[string]map[string]string
	reads int
}

func (r *mapReader) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	r.reads++
	data, ok := r.data[key.Name]
	if !ok {
		return apierrors.NewNotFound(schema.GroupResource{Resource: "configmaps"}, key.Name)
	}
	obj.(*corev1.ConfigMap).ObjectMeta = metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace}
	obj.(*corev1.ConfigMap).Data = data
	return nil
}

func lookupCounter() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lookups"}, []string{"result"})
}

// TestAPIReadsAreBounded: a review that needs a ConfigMap or a namespace the
// caches do not have gives up after --api-read-timeout, well inside the
// webhook's own timeout, rather than waiting on a stalled API server.
func TestAPIReadsAreBounded(t *testing.T) {
	ctx := context.Background() // no deadline of its own
	cms := NewConfigMaps(hangingReader{}, time.Second, 50*time.Millisecond, lookupCounter())
	if _, err := cms.ConfigMapData(ctx, "team", "gpus"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("ConfigMap read from a stalled API server: %v, want the read timeout", err)
	}
	ns := NewNamespaces(emptyCache{}, hangingReader{}, 50*time.Millisecond)
	if _, err := ns.NamespaceLabels(ctx, "team"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("namespace read from a stalled API server: %v, want the read timeout", err)
	}
}

// TestConfigMapsAreCached: found and missing ConfigMaps are each read once
// within the TTL, and a missing one reads as policy.ErrConfigMapNotFound.
func TestConfigMapsAreCached(t *testing.T) {
	ctx := context.Background()
	r := &mapReader{data: map[string]map[string]string{"gpus": {"NVIDIA_VISIBLE_DEVICES": "all"}}}
	lookups := lookupCounter()
	cms := NewConfigMaps(r, time.Minute, time.Second, lookups)
	for range 3 {
		if data, err := cms.ConfigMapData(ctx, "team", "gpus"); err != nil || data["NVIDIA_VISIBLE_DEVICES"] != "all" {
			t.Fatalf("gpus: %v %v", data, err)
		}
		if _, err := cms.ConfigMapData(ctx, "team", "absent"); !errors.Is(err, policy.ErrConfigMapNotFound) {
			t.Fatalf("absent: %v, want ErrConfigMapNotFound", err)
		}
	}
	if r.reads != 2 {
		t.Errorf("%d reads from the API server, want 2", r.reads)
	}
	if got := testutil.ToFloat64(lookups.WithLabelValues("hit")); got != 4 {
		t.Errorf("%v cache hits, want 4", got)
	}
}

// nodeReader serves one node, answering NotFound for the rest.
type nodeReader struct {
	client.Reader
	node *corev1.Node
}

func (r nodeReader) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	if key.Name != r.node.Name {
		return apierrors.NewNotFound(schema.GroupResource{Resource: "nodes"}, key.Name)
	}
	r.node.DeepCopyInto(obj.(*corev1.Node))
	return nil
}

// TestNodes: a node's allocatable is read, a missing node is
// policy.ErrNodeNotFound (it advertises nothing), and a stalled API server
// is an error within the read timeout, never a silent answer.
func TestNodes(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"},
		Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("8")}}}
	nodes := NewNodes(nodeReader{node: node}, time.Second)
	got, err := nodes.NodeAllocatable(context.Background(), "gpu-1")
	if q := got["nvidia.com/gpu"]; err != nil || q.Value() != 8 {
		t.Errorf("gpu-1: %v, %v; want 8 GPUs", got, err)
	}
	if _, err := nodes.NodeAllocatable(context.Background(), "gpu-2"); !errors.Is(err, policy.ErrNodeNotFound) {
		t.Errorf("a missing node: %v, want ErrNodeNotFound", err)
	}
	_, err = NewNodes(hangingReader{}, 50*time.Millisecond).NodeAllocatable(context.Background(), "gpu-1")
	if err == nil || errors.Is(err, policy.ErrNodeNotFound) {
		t.Errorf("a stalled API server: %v, want a timeout error", err)
	}
}
