package hardening

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	resourcev1beta1 "k8s.io/api/resource/v1beta1"
	resourcev1beta2 "k8s.io/api/resource/v1beta2"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/gpuguard/gpuguard/internal/wellknown"
)

func slice(name, driver, node string) *resourcev1.ResourceSlice {
	return &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourcev1.ResourceSliceSpec{Driver: driver, NodeName: &node, Pool: resourcev1.ResourcePool{Name: node, ResourceSliceCount: 1},
			Devices: []resourcev1.Device{{Name: "gpu-0", Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
				"productName": {StringValue: ptr("NVIDIA H100")}}}}}}
}

func ptr[T any](v T) *T { return &v }

// TestDRAOnlyNodesAreGPUNodes: a node with no GPU label and no GPU resource
// in its status, on which a GPU driver publishes a ResourceSlice, is a GPU
// node: it keeps the injection on until it is covered. Another driver's
// slice does not make one, nor a GPU driver's slice for another node.
func TestDRAOnlyNodesAreGPUNodes(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	hardened := lease("gpuguard-enforcer-covered", "covered", now, 60)
	covered := node("covered", map[string]string{"nvidia.com/gpu.present": "true"})
	dra := node("dra", map[string]string{"kubernetes.io/os": "linux"})
	perDevice := slice("per-device", "gpu.nvidia.com", "")
	perDevice.Spec.NodeName = nil
	perDevice.Spec.PerDeviceNodeSelection = ptr(true)
	perDevice.Spec.Devices[0].NodeName = ptr("dra")
	v1beta1Slice := &resourcev1beta1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "beta1"},
		Spec: resourcev1beta1.ResourceSliceSpec{Driver: "gpu.nvidia.com", NodeName: "dra", Pool: resourcev1beta1.ResourcePool{Name: "dra", ResourceSliceCount: 1}}}
	v1beta2Slice := &resourcev1beta2.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "beta2"},
		Spec: resourcev1beta2.ResourceSliceSpec{Driver: "gpu.nvidia.com", NodeName: ptr("dra"), Pool: resourcev1beta2.ResourcePool{Name: "dra", ResourceSliceCount: 1}}}
	for _, tc := range []struct {
		name    string
		version string
		objs    []client.Object
		want    bool
		why     string
	}{
		{"a GPU driver's slice on the node", "v1", []client.Object{slice("s", "gpu.nvidia.com", "dra")}, false, "GPU node dra does not report"},
		{"the node's enforcer covers it", "v1", []client.Object{slice("s", "gpu.nvidia.com", "dra"), lease("gpuguard-enforcer-dra", "dra", now, 60)}, true, "all 2 GPU nodes"},
		{"devices selected per node", "v1", []client.Object{perDevice}, false, "GPU node dra does not report"},
		{"v1beta2", "v1beta2", []client.Object{v1beta2Slice}, false, "GPU node dra does not report"},
		{"v1beta1", "v1beta1", []client.Object{v1beta1Slice}, false, "GPU node dra does not report"},
		{"another driver's slice", "v1", []client.Object{slice("s", "nic.example.com", "dra")}, true, "all 1 GPU nodes"},
		{"a GPU driver's slice on another node", "v1", []client.Object{slice("s", "gpu.nvidia.com", "gone")}, true, "all 1 GPU nodes"},
		{"a version the API server does not serve is not read", "", []client.Object{slice("s", "gpu.nvidia.com", "dra")}, true, "all 1 GPU nodes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientBuilder().WithObjects(append(tc.objs, covered, dra, hardened)...).Build()
			n := &Nodes{Reader: c, GPUNodeLabels: gpuLabels, LeaseNamespace: "gpuguard-system", Now: func() time.Time { return now },
				SliceVersion: tc.version, GPUDRADrivers: DefaultGPUDRADrivers()}
			v, err := n.AllHardened(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if v.Hardened != tc.want || !strings.Contains(v.Why, tc.why) {
				t.Errorf("got %v (%s), want %v (%s)", v.Hardened, v.Why, tc.want, tc.why)
			}
		})
	}
}

// TestUnreadableSlicesKeepInjecting: slices that cannot be listed are an
// error, which keeps the injection on, not a cluster without DRA GPUs.
func TestUnreadableSlicesKeepInjecting(t *testing.T) {
	c := fake.NewClientBuilder().WithObjects(node("n", map[string]string{"nvidia.com/gpu.present": "true", wellknown.HardenedMarkLabel: "true"})).Build()
	n := &Nodes{Reader: c, GPUNodeLabels: gpuLabels, SliceVersion: "v1alpha3", GPUDRADrivers: DefaultGPUDRADrivers()}
	if _, err := n.AllHardened(context.Background()); err == nil || !strings.Contains(err.Error(), "resource.k8s.io/v1alpha3") {
		t.Errorf("got %v, want an error naming the version", err)
	}
}

// TestServedSliceVersion: the webhook reads the first of v1, v1beta2 and
// v1beta1 the API server serves, and none where it serves none of them.
func TestServedSliceVersion(t *testing.T) {
	for _, tc := range []struct {
		served []string
		want   string
	}{
		{[]string{"v1", "v1beta2", "v1beta1"}, "v1"},
		{[]string{"v1beta1", "v1beta2"}, "v1beta2"},
		{[]string{"v1beta1"}, "v1beta1"},
		{[]string{"v1alpha3"}, ""},
		{nil, ""},
	} {
		var gvs []schema.GroupVersion
		for _, v := range tc.served {
			gvs = append(gvs, schema.GroupVersion{Group: "resource.k8s.io", Version: v})
		}
		m := meta.NewDefaultRESTMapper(gvs)
		for _, gv := range gvs {
			m.Add(gv.WithKind("ResourceSlice"), meta.RESTScopeRoot)
		}
		got, served, err := ServedSliceVersion(m)
		if err != nil || got != tc.want || !slices.Equal(served, tc.served) && len(tc.served) > 0 {
			t.Errorf("served %v: got %q (%v), %v; want %q", tc.served, got, served, err, tc.want)
		}
	}
}

// TestTrimSlice: the cache keeps a slice's driver and nodes, not its
// devices' attributes.
func TestTrimSlice(t *testing.T) {
	s := slice("s", "gpu.nvidia.com", "dra")
	s.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet-plugin"}}
	out, err := TrimSlice(s)
	if err != nil {
		t.Fatal(err)
	}
	trimmed := out.(*resourcev1.ResourceSlice)
	if driver, nodes, ok := SliceNodes(trimmed); !ok || driver != "gpu.nvidia.com" || !slices.Equal(nodes, []string{"dra"}) {
		t.Errorf("trimmed slice reads as %q %v %v", driver, nodes, ok)
	}
	if trimmed.Spec.Devices[0].Attributes != nil || trimmed.ManagedFields != nil {
		t.Errorf("attributes or managed fields kept: %+v", trimmed)
	}
}
