package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"

	"github.com/gpuguard/gpuguard/internal/wellknown"
)

func labelled(gvr schema.GroupVersionResource, kind, ns, name string, labels map[string]string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(gvr.GroupVersion().String())
	u.SetKind(kind)
	u.SetNamespace(ns)
	u.SetName(name)
	u.SetLabels(labels)
	return u
}

// TestCleanup: what gpuguard wrote is removed, and nothing else: another
// tool's Report, a VAP of the cluster's own, a node's other labels, other
// Leases; --dry-run lists the same and removes nothing.
func TestCleanup(t *testing.T) {
	ours := map[string]string{wellknown.ManagedByLabel: wellknown.ManagedBy}
	theirs := map[string]string{wellknown.ManagedByLabel: "kyverno"}
	backstop := wellknown.OwnedLabels(wellknown.ComponentCELBackstop)
	gvr := map[string]schema.GroupVersionResource{}
	listKinds := map[schema.GroupVersionResource]string{}
	for _, t := range cleanupTargets {
		gvr[t.what] = t.gvr
		listKinds[t.gvr] = t.what + "List"
	}
	objects := func() []runtime.Object {
		return []runtime.Object{
			labelled(gvr["Report"], "Report", "team-a", "gpuguard", ours),
			labelled(gvr["Report"], "Report", "team-a", "kyverno-report", theirs),
			labelled(gvr["ClusterReport"], "ClusterReport", "", "gpuguard-node-gpu-1", ours),
			labelled(gvr["ValidatingAdmissionPolicy"], "ValidatingAdmissionPolicy", "", "gpuguard-backstop", backstop),
			labelled(gvr["ValidatingAdmissionPolicy"], "ValidatingAdmissionPolicy", "", "cluster-own", nil),
			labelled(gvr["MutatingAdmissionPolicyBinding"], "MutatingAdmissionPolicyBinding", "", "gpuguard-backstop", backstop),
		}
	}
	kubeObjects := func() []runtime.Object {
		return []runtime.Object{
			&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1", Labels: map[string]string{
				wellknown.HardenedLabel: "true", wellknown.HardenedMarkLabel: "true", wellknown.CheckLabelPrefix + "cdi-mode": "pass",
				"nvidia.com/gpu.present": "true"}}},
			&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cpu-1", Labels: map[string]string{"kubernetes.io/os": "linux"}}},
			&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "gpuguard", Name: wellknown.EnforcerLeasePrefix + "gpu-1"}},
			&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "gpuguard", Name: wellknown.AuditLease}},
			&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "gpuguard", Name: "someone-else"}},
		}
	}
	for _, dryRun := range []bool{true, false} {
		dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), listKinds, objects()...)
		kube := kubefake.NewClientset(kubeObjects()...)
		var out bytes.Buffer
		o := &cleanupOptions{namespace: "gpuguard", dryRun: dryRun}
		if err := o.run(context.Background(), &out, kube, dyn); err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"Report team-a/gpuguard", "ClusterReport gpuguard-node-gpu-1", "ValidatingAdmissionPolicy gpuguard-backstop",
			"MutatingAdmissionPolicyBinding gpuguard-backstop", "from node gpu-1", "Lease gpuguard/gpuguard-enforcer-gpu-1", "Lease gpuguard/gpuguard-audit"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("dry run %v: output lacks %q:\n%s", dryRun, want, out.String())
			}
		}
		for _, unwanted := range []string{"kyverno-report", "cluster-own", "cpu-1", "someone-else", "nvidia.com/gpu.present"} {
			if strings.Contains(out.String(), unwanted) {
				t.Errorf("dry run %v: output names %q:\n%s", dryRun, unwanted, out.String())
			}
		}
		ctx := context.Background()
		reports, _ := dyn.Resource(gvr["Report"]).Namespace("team-a").List(ctx, metav1.ListOptions{})
		vaps, _ := dyn.Resource(gvr["ValidatingAdmissionPolicy"]).List(ctx, metav1.ListOptions{})
		node, _ := kube.CoreV1().Nodes().Get(ctx, "gpu-1", metav1.GetOptions{})
		leases, _ := kube.CoordinationV1().Leases("gpuguard").List(ctx, metav1.ListOptions{})
		wantLeft := map[bool][4]int{true: {2, 2, 4, 3}, false: {1, 1, 1, 1}}[dryRun]
		if got := [4]int{len(reports.Items), len(vaps.Items), len(node.Labels), len(leases.Items)}; got != wantLeft {
			t.Errorf("dry run %v: left reports, VAPs, gpu-1's labels, Leases = %v, want %v (labels %v)", dryRun, got, wantLeft, node.Labels)
		}
		if !dryRun && node.Labels["nvidia.com/gpu.present"] != "true" {
			t.Errorf("a label not gpuguard's was removed: %v", node.Labels)
		}
	}
	if err := (&cleanupOptions{}).run(context.Background(), &bytes.Buffer{}, kubefake.NewClientset(), nil); err == nil || !strings.Contains(err.Error(), "--namespace") {
		t.Errorf("without --namespace: %v", err)
	}
}
