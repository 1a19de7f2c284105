package verifier

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpuguard/gpuguard/config"
)

func TestExemptionsByServiceAccount(t *testing.T) {
	pod := func(name, uid, sa string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "gpu-infra", Name: name, UID: types.UID("u-" + uid)},
			Spec: corev1.PodSpec{ServiceAccountName: sa}}
	}
	client := fake.NewClientset(pod("dcgm", "1", "dcgm-exporter"), pod("tenant", "2", ""), pod("plugin", "3", "device-plugin"),
		pod("exporter", "4", "node-exporter"))
	gets := 0
	client.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) { gets++; return false, nil, nil })
	p := config.Default()
	p.Spec.Exemptions.Namespaces = []string{"gpu-operator"}
	p.Spec.Exemptions.ServiceAccounts = []config.ServiceAccountExemption{
		{Namespace: "gpu-infra", Name: "dcgm-exporter"},
		{Namespace: "gpu-infra", Name: "device-plugin", Rules: []string{"inject-void", "sensitive-hostpath"}},
		{Namespace: "gpu-infra", Name: "node-exporter", Rules: []string{"sensitive-hostpath"}},
	}
	e := &Exemptions{Client: client}
	e.Set(p, []string{"monitoring"})
	ctx := context.Background()
	for _, c := range []struct {
		c Container
		// want is the exemption; unallocated and allocated, whether it
		// lets the container reach unallocated GPUs without and with an
		// allocation of its own.
		want                   string
		unallocated, allocated bool
	}{
		{Container{PodUID: "u-1", Key: key("gpu-infra", "dcgm", "exporter")}, "service account gpu-infra/dcgm-exporter", true, true},
		{Container{PodUID: "u-1", Key: key("gpu-infra", "dcgm", "exporter")}, "service account gpu-infra/dcgm-exporter", true, true},
		{Container{PodUID: "u-2", Key: key("gpu-infra", "tenant", "main")}, "", false, false}, // runs as default
		{Container{PodUID: "u-9", Key: key("gpu-infra", "gone", "main")}, "", false, false},
		// Waives inject-void: keeps the image's all with nothing allocated,
		// but an allocation of its own is all it may reach (device-env).
		{Container{PodUID: "u-3", Key: key("gpu-infra", "plugin", "main")}, "service account gpu-infra/device-plugin", true, false},
		// Waives host paths only: GPUs are judged as anyone's.
		{Container{PodUID: "u-4", Key: key("gpu-infra", "exporter", "main")}, "service account gpu-infra/node-exporter", false, false},
		{Container{Key: key("gpu-operator", "plugin", "main")}, "namespace gpu-operator", true, true},
		{Container{Key: key("monitoring", "exporter", "main")}, "namespace monitoring", true, true},
	} {
		if got, _ := e.Of(ctx, c.c); got != c.want {
			t.Errorf("%s: exemption %q, want %q", c.c.Key, got, c.want)
		}
		for allocated, want := range map[bool]bool{false: c.unallocated, true: c.allocated} {
			if got := e.OfGPUs(ctx, c.c, allocated) != ""; got != want {
				t.Errorf("%s, allocated %v: exempt from the GPU finding %v, want %v", c.c.Key, allocated, got, want)
			}
		}
	}
	// Once per pod found, three times the gone one (asked again on each
	// call), none for a namespace.
	if gets != 7 {
		t.Errorf("%d pod reads, want 7: once per pod, a gone pod each time, namespaces without a read", gets)
	}
}
