//go:build e2e

package cluster

import (
	"context"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpuguard/gpuguard/internal/wellknown"
)

// TestKubeletCannotClaimHardened: with the kubelet's own identity
// (system:node:<node>, as the cluster's NodeRestriction admission plugin
// knows it), the node may label itself gpuguard.io/hardened=true, which is
// why the hardened-cluster profile never reads that label, but may not set
// the mark the profile does read: node-restriction.kubernetes.io/ is
// reserved. Root on a node therefore cannot switch void injection off for
// the cluster by labelling its Node.
func TestKubeletCannotClaimHardened(t *testing.T) {
	path, err := s.cp.KubeconfigFor("system:node:"+nodeName, "system:nodes")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	kubelet, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	label := func(key string) error {
		patch := []byte(`{"metadata":{"labels":{"` + key + `":"true"}}}`)
		_, err := kubelet.CoreV1().Nodes().Patch(context.Background(), nodeName, types.MergePatchType, patch,
			metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	if err := label(wellknown.HardenedLabel); err != nil {
		t.Fatalf("the kubelet may label its own node %s (the test's premise): %v", wellknown.HardenedLabel, err)
	}
	if err := label(wellknown.HardenedMarkLabel); !apierrors.IsForbidden(err) {
		t.Errorf("the kubelet labelling its own node %s: %v, want forbidden by NodeRestriction", wellknown.HardenedMarkLabel, err)
	}
}
