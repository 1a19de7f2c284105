//go:build e2e

package node

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// unadvertisedResource is a GPU resource of the default policy that the
// suite's node does not advertise: its device plugin hands out whole GPUs.
const unadvertisedResource = "nvidia.com/mig-1g.10gb"

// unhonouredPod is a probe pod, created bound to the node as every probe
// is, asking for a MIG slice the node does not advertise. Its image bakes
// in NVIDIA_VISIBLE_DEVICES=all, as CUDA images do.
func unhonouredPod(prefix string) *corev1.Pod { return limitPod(prefix, unadvertisedResource) }

// testUnhonouredRequestLeaks is the baseline: the kubelet drops the request
// the node cannot honour (removeMissingExtendedResources), the device
// manager allocates nothing, and the image's all gives every GPU.
func testUnhonouredRequestLeaks(t *testing.T) {
	report, _ := probe(t, tenantNS, unhonouredPod("unhonoured"))
	expectGPUs(t, report, allGPUs())
}

// testUnhonouredRequestClosed: gpuguard reads the node, finds the resource
// missing, judges the container as one without GPUs and gives it void.
func testUnhonouredRequestClosed(t *testing.T) {
	expectVoidAndNoGPU(t, unhonouredPod("unhonoured"))
}
