package hardening

import (
	"context"
	"fmt"
	"slices"

	resourcev1 "k8s.io/api/resource/v1"
	resourcev1beta1 "k8s.io/api/resource/v1beta1"
	resourcev1beta2 "k8s.io/api/resource/v1beta2"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// A node whose GPUs a DRA driver publishes (ResourceSlices of
// resource.k8s.io) advertises no nvidia.com/gpu and may carry no GPU label:
// it is a GPU node all the same, and a pod bound to it gets every GPU from
// the runtime unless void is injected or the node is covered.

// DefaultGPUDRADrivers are the DRA drivers whose devices are GPUs: NVIDIA's
// DRA driver for GPUs publishes its ResourceSlices as gpu.nvidia.com
// (DriverName in NVIDIA/k8s-dra-driver-gpu, cmd/gpu-kubelet-plugin).
// Its compute-domain.nvidia.com driver publishes IMEX channels, no GPUs.
func DefaultGPUDRADrivers() []string { return []string{"gpu.nvidia.com"} }

// SliceVersions are the resource.k8s.io versions whose ResourceSlices the
// webhook reads, preferred first: v1 from Kubernetes 1.34, v1beta2 and
// v1beta1 before (beta APIs are served only where the cluster turned them
// on).
var SliceVersions = []string{resourcev1.SchemeGroupVersion.Version, resourcev1beta2.SchemeGroupVersion.Version,
	resourcev1beta1.SchemeGroupVersion.Version}

// ServedSliceVersion is the first of SliceVersions the API server serves
// ResourceSlices in, by discovery; "" when it serves none of them, where no
// DRA driver can publish a device in a version gpuguard reads (served is
// then what it does serve, for the log, if anything).
func ServedSliceVersion(mapper meta.RESTMapper) (version string, served []string, err error) {
	gk := schema.GroupKind{Group: resourcev1.GroupName, Kind: "ResourceSlice"}
	mappings, err := mapper.RESTMappings(gk)
	if meta.IsNoMatchError(err) {
		return "", nil, nil
	}
	if err != nil {
		return "", nil, fmt.Errorf("discovering the served versions of %s ResourceSlices: %w", gk.Group, err)
	}
	for _, m := range mappings {
		served = append(served, m.GroupVersionKind.Version)
	}
	for _, v := range SliceVersions {
		if slices.Contains(served, v) {
			return v, served, nil
		}
	}
	return "", served, nil
}

// NewSlice is an empty ResourceSlice of version (one of SliceVersions),
// for a watch; nil for another version.
func NewSlice(version string) client.Object {
	switch version {
	case resourcev1.SchemeGroupVersion.Version:
		return &resourcev1.ResourceSlice{}
	case resourcev1beta2.SchemeGroupVersion.Version:
		return &resourcev1beta2.ResourceSlice{}
	case resourcev1beta1.SchemeGroupVersion.Version:
		return &resourcev1beta1.ResourceSlice{}
	}
	return nil
}

func newSliceList(version string) (client.ObjectList, error) {
	switch version {
	case resourcev1.SchemeGroupVersion.Version:
		return &resourcev1.ResourceSliceList{}, nil
	case resourcev1beta2.SchemeGroupVersion.Version:
		return &resourcev1beta2.ResourceSliceList{}, nil
	case resourcev1beta1.SchemeGroupVersion.Version:
		return &resourcev1beta1.ResourceSliceList{}, nil
	}
	return nil, fmt.Errorf("ResourceSlices of resource.k8s.io/%s: not a version gpuguard reads (want one of %v)", version, SliceVersions)
}

// SliceNodes are the driver of a ResourceSlice (of any of SliceVersions)
// and the nodes its devices are on: its spec.nodeName, or, where the
// driver selects nodes per device, each device's nodeName. false for
// another object.
func SliceNodes(obj client.Object) (driver string, nodes []string, ok bool) {
	add := func(name *string) {
		if name != nil && *name != "" {
			nodes = append(nodes, *name)
		}
	}
	switch s := obj.(type) {
	case *resourcev1.ResourceSlice:
		add(s.Spec.NodeName)
		for _, d := range s.Spec.Devices {
			add(d.NodeName)
		}
		return s.Spec.Driver, nodes, true
	case *resourcev1beta2.ResourceSlice:
		add(s.Spec.NodeName)
		for _, d := range s.Spec.Devices {
			add(d.NodeName)
		}
		return s.Spec.Driver, nodes, true
	case *resourcev1beta1.ResourceSlice:
		add(&s.Spec.NodeName)
		for _, d := range s.Spec.Devices {
			if d.Basic != nil {
				add(d.Basic.NodeName)
			}
		}
		return s.Spec.Driver, nodes, true
	}
	return "", nil, false
}

// TrimSlice keeps of a ResourceSlice what SliceNodes reads (a cache
// transform): a driver's slices list every device with its attributes and
// capacities, which the webhook does not need to hold.
func TrimSlice(obj any) (any, error) {
	switch s := obj.(type) {
	case *resourcev1.ResourceSlice:
		for i, d := range s.Spec.Devices {
			s.Spec.Devices[i] = resourcev1.Device{Name: d.Name, NodeName: d.NodeName}
		}
	case *resourcev1beta2.ResourceSlice:
		for i, d := range s.Spec.Devices {
			s.Spec.Devices[i] = resourcev1beta2.Device{Name: d.Name, NodeName: d.NodeName}
		}
	case *resourcev1beta1.ResourceSlice:
		for i, d := range s.Spec.Devices {
			trimmed := resourcev1beta1.Device{Name: d.Name}
			if d.Basic != nil {
				trimmed.Basic = &resourcev1beta1.BasicDevice{NodeName: d.Basic.NodeName}
			}
			s.Spec.Devices[i] = trimmed
		}
	default:
		return obj, nil
	}
	obj.(client.Object).SetManagedFields(nil)
	return obj, nil
}

// draGPUNodes are the nodes on which a GPU driver (GPUDRADrivers)
// publishes devices, from the ResourceSlices of SliceVersion; none when
// SliceVersion is "".
func (n *Nodes) draGPUNodes(ctx context.Context) (map[string]bool, error) {
	if n.SliceVersion == "" || len(n.GPUDRADrivers) == 0 {
		return nil, nil
	}
	list, err := newSliceList(n.SliceVersion)
	if err != nil {
		return nil, err
	}
	if err := n.Reader.List(ctx, list); err != nil {
		return nil, fmt.Errorf("listing DRA ResourceSlices: %w", err)
	}
	items, err := meta.ExtractList(list)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, item := range items {
		driver, nodes, ok := SliceNodes(item.(client.Object))
		if !ok || !slices.Contains(n.GPUDRADrivers, driver) {
			continue
		}
		for _, node := range nodes {
			out[node] = true
		}
	}
	return out, nil
}
