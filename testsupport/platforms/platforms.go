// Package platforms describes the nodes of each platform the chart's
// `platform` value has a profile for, as the platform creates them: its
// default GPU nodes, which gpuguard's agent must run on, its CPU nodes, which
// it must not, and the RuntimeClasses the platform (or the GPU Operator it
// documents) creates. The chart's tests judge the agent's placement against
// it by simulation, the cluster suite with the real DaemonSet controller and
// scheduler; docs/platforms.md is where each fact comes from.
package platforms

import corev1 "k8s.io/api/core/v1"

// Node is a node as a platform creates it: its labels and taints.
type Node struct {
	Name   string
	Labels map[string]string
	Taints []corev1.Taint
}

// Platform is what a platform's clusters have that the agent's placement
// depends on.
type Platform struct {
	GPU, CPU []Node
	// RuntimeClasses are the RuntimeClasses a cluster of the platform has
	// without anyone creating one by hand: `nvidia` where the GPU Operator
	// (or, on k3s and RKE2, the page's own step) creates it, none where the
	// platform's default runtime is NVIDIA's or there is no NVIDIA runtime.
	RuntimeClasses []string
}

// NVIDIARuntimeClass is the RuntimeClass the GPU Operator creates.
const NVIDIARuntimeClass = "nvidia"

var (
	gpuTaint = corev1.Taint{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}
	skuTaint = corev1.Taint{Key: "sku", Value: "gpu", Effect: corev1.TaintEffectNoSchedule}
	// The taint Karpenter's and EKS Auto Mode's GPU NodePools document.
	gpuTaintNoValue = corev1.Taint{Key: "nvidia.com/gpu", Effect: corev1.TaintEffectNoSchedule}
)

// All are the platforms by the chart's name for them.
var All = map[string]Platform{
	"generic": {
		GPU: []Node{
			{"gfd", map[string]string{"nvidia.com/gpu.present": "true"}, []corev1.Taint{gpuTaint}},
			{"nfd", map[string]string{"feature.node.kubernetes.io/pci-10de.present": "true"}, nil},
		},
		CPU: []Node{
			{"cpu", map[string]string{"kubernetes.io/os": "linux"}, nil},
			{"gke-gpu-without-profile", map[string]string{"cloud.google.com/gke-accelerator": "nvidia-l4"}, []corev1.Taint{gpuTaint}},
		},
		RuntimeClasses: []string{NVIDIARuntimeClass},
	},
	"eks": {
		GPU: []Node{
			// A managed node group labelled as the cluster autoscaler expects.
			{"managed-node-group", map[string]string{"k8s.amazonaws.com/accelerator": "nvidia-tesla-a10g", "node.kubernetes.io/instance-type": "g5.xlarge"}, nil},
			{"karpenter", map[string]string{"karpenter.k8s.aws/instance-gpu-manufacturer": "nvidia", "karpenter.k8s.aws/instance-gpu-count": "1"}, []corev1.Taint{gpuTaintNoValue}},
			{"auto-mode", map[string]string{"eks.amazonaws.com/instance-gpu-manufacturer": "nvidia", "eks.amazonaws.com/compute-type": "auto"}, []corev1.Taint{gpuTaintNoValue}},
			{"gpu-operator", map[string]string{"nvidia.com/gpu.present": "true"}, nil},
		},
		CPU: []Node{
			{"cpu", map[string]string{"node.kubernetes.io/instance-type": "m5.large", "eks.amazonaws.com/nodegroup": "system"}, nil},
			{"neuron", map[string]string{"karpenter.k8s.aws/instance-gpu-manufacturer": "aws"}, nil},
		},
	},
	"gke": {
		GPU: []Node{
			{"l4", map[string]string{"cloud.google.com/gke-accelerator": "nvidia-l4", "cloud.google.com/gke-gpu-driver-version": "default"}, []corev1.Taint{gpuTaint}},
		},
		CPU: []Node{{"cpu", map[string]string{"cloud.google.com/gke-nodepool": "default-pool"}, nil}},
	},
	"aks": {
		GPU: []Node{
			{"sku-tainted", map[string]string{"kubernetes.azure.com/accelerator": "nvidia", "kubernetes.azure.com/agentpool": "gpunp"}, []corev1.Taint{skuTaint}},
			{"untainted", map[string]string{"kubernetes.azure.com/accelerator": "nvidia"}, nil},
		},
		CPU: []Node{{"cpu", map[string]string{"kubernetes.azure.com/agentpool": "nodepool1"}, nil}},
	},
	"openshift": {
		GPU: []Node{
			{"nfd-gfd", map[string]string{"feature.node.kubernetes.io/pci-10de.present": "true", "nvidia.com/gpu.present": "true", "node-role.kubernetes.io/worker": ""}, nil},
		},
		CPU:            []Node{{"worker", map[string]string{"node-role.kubernetes.io/worker": ""}, nil}},
		RuntimeClasses: []string{NVIDIARuntimeClass},
	},
	"k3s": {
		GPU:            []Node{{"gfd", map[string]string{"nvidia.com/gpu.present": "true", "node.kubernetes.io/instance-type": "k3s"}, nil}},
		CPU:            []Node{{"cpu", map[string]string{"node.kubernetes.io/instance-type": "k3s"}, nil}},
		RuntimeClasses: []string{NVIDIARuntimeClass},
	},
	"rke2": {
		GPU:            []Node{{"nfd", map[string]string{"feature.node.kubernetes.io/pci-10de.present": "true", "node.kubernetes.io/instance-type": "rke2"}, nil}},
		CPU:            []Node{{"cpu", map[string]string{"node.kubernetes.io/instance-type": "rke2"}, nil}},
		RuntimeClasses: []string{NVIDIARuntimeClass},
	},
}
