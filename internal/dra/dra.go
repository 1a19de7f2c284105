// Package dra reads the device names of NVIDIA's DRA GPU driver
// (kubernetes-sigs/dra-driver-nvidia-gpu, formerly NVIDIA/k8s-dra-driver-gpu),
// which the kubelet's PodResources API reports for a container's claims.
// The node verifier and the node enforcer both turn them into GPUs.
//
// Verified against the driver's cmd/gpu-kubelet-plugin at v25.8.1 and at
// commit 22407113 (chart 0.5.0-dev): GpuInfo.CanonicalName is
// "gpu-<minor>", a MIG device's "gpu-<parent minor>-mig-...", a passthrough
// GPU's "gpu-vfio-<n>"; the number is the device node's minor
// (/dev/nvidia<minor>), not the NVML index. The CDI device the kubelet hands
// the runtime for a claimed device is
// "k8s.gpu.nvidia.com/claim=<claim UID>-<device name>" (GetClaimDeviceName),
// in a transient spec per claim whose common edits set
// NVIDIA_VISIBLE_DEVICES=void.
package dra

import (
	"strconv"
	"strings"
)

// GPUDriver is the DRA driver name of NVIDIA's GPU driver.
const GPUDriver = "gpu.nvidia.com"

// NVIDIADriver reports whether a DRA driver is one of NVIDIA's
// (gpu.nvidia.com, compute-domain.nvidia.com), whose devices reach the
// GPU driver's nodes.
func NVIDIADriver(driver string) bool {
	return driver == "nvidia.com" || strings.HasSuffix(driver, ".nvidia.com")
}

// ParseGPUDevice reads a device name of the GPU driver: "gpu-<minor>" is the
// whole GPU whose node has that minor, "gpu-<minor>-mig-..." a MIG device of
// it. ok is false for any other name: a passthrough "gpu-vfio-<n>", which
// opens no NVIDIA node, or a scheme not known.
func ParseGPUDevice(name string) (minor int, mig, ok bool) {
	rest, found := strings.CutPrefix(name, "gpu-")
	if !found {
		return 0, false, false
	}
	num, tail, _ := strings.Cut(rest, "-")
	minor, err := strconv.Atoi(num)
	if err != nil || minor < 0 || num != strconv.Itoa(minor) {
		return 0, false, false
	}
	switch {
	case tail == "":
		return minor, false, true
	case strings.HasPrefix(tail, "mig-"):
		return minor, true, true
	}
	return 0, false, false
}
