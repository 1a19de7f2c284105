package verifier

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func TestNodeReportWritesOnChangeOnly(t *testing.T) {
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{clusterReports: "ClusterReportList"})
	writes := 0
	client.PrependReactor("*", "clusterreports", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetVerb() == "create" || a.GetVerb() == "update" {
			writes++
		}
		return false, nil, nil
	})
	n := &NodeReport{Client: client, Node: "gpu-node-1",
		Nodes: fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node-1", UID: "node-uid"}})}
	leak := Container{ID: "c1", PodUID: "u1", Key: key("team-a", "leak", "main")}
	pass := Pass{Containers: 3, Findings: []Finding{
		{Container: leak, GPU: Reached{UUID: "GPU-0", Path: "/dev/nvidia0"}, SeenBy: "device-node"},
		{Container: Container{ID: "c2", Key: key("gpu-operator", "dcgm", "exporter")}, GPU: Reached{UUID: "GPU-0", Path: "/dev/nvidia0"}, Exempt: "namespace gpu-operator"},
	}}
	ctx := context.Background()
	for i, now := range []time.Time{time.Unix(100, 0), time.Unix(110, 0)} {
		if err := n.Write(ctx, pass, now); err != nil {
			t.Fatalf("pass %d: %v", i, err)
		}
	}
	if writes != 1 {
		t.Errorf("%d writes for two passes with the same findings, want 1", writes)
	}
	got, err := client.Resource(clusterReports).Get(ctx, "gpuguard-node-gpu-node-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if owners := got.GetOwnerReferences(); len(owners) != 1 || owners[0].Kind != "Node" || owners[0].UID != "node-uid" {
		t.Errorf("owner references %+v, want the Node, so the report goes with it", owners)
	}
	results, _, _ := unstructured.NestedSlice(got.Object, "results")
	fail, _, _ := unstructured.NestedInt64(got.Object, "summary", "fail")
	pass64, _, _ := unstructured.NestedInt64(got.Object, "summary", "pass")
	if len(results) != 1 || fail != 1 || pass64 != 2 {
		t.Fatalf("results %v, summary fail %d pass %d; want the one non-exempt finding, 2 passing containers", results, fail, pass64)
	}
	r := results[0].(map[string]any)
	if r["rule"] != RuleUnallocatedGPUAccess || r["result"] != "fail" || !strings.Contains(r["message"].(string), "GPU-0") ||
		r["properties"].(map[string]any)["gpu"] != "GPU-0" {
		t.Errorf("result %v", r)
	}
	// Past resyncEvery without change, the stored report is read, and
	// written again only if it was edited by hand.
	if err := n.Write(ctx, pass, time.Unix(100, 0).Add(resyncEvery)); err != nil {
		t.Fatal(err)
	}
	if writes != 1 {
		t.Errorf("%d writes, want none at a resync that finds the report as written", writes)
	}
	unstructured.RemoveNestedField(got.Object, "results")
	if _, err := client.Resource(clusterReports).Update(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	writes--
	if err := n.Write(ctx, pass, time.Unix(100, 0).Add(2*resyncEvery)); err != nil {
		t.Fatal(err)
	}
	if writes != 2 {
		t.Errorf("%d writes, want the report written again at the resync after an edit by hand", writes)
	}
	if err := n.Write(ctx, Pass{Containers: 2}, time.Unix(120, 0).Add(2*resyncEvery)); err != nil {
		t.Fatal(err)
	}
	got, _ = client.Resource(clusterReports).Get(ctx, "gpuguard-node-gpu-node-1", metav1.GetOptions{})
	if results, _, _ := unstructured.NestedSlice(got.Object, "results"); len(results) != 0 || writes != 3 {
		t.Errorf("after the pod went: results %v, writes %d; want none and a third write", results, writes)
	}
}
