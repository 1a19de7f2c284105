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
	client := fake.NewClientset(pod("dcgm", "1", "dcgm-exporter"), pod("tenant", "2", ""))
	gets := 0
	client.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) { gets++; return false, nil, nil })
	p := config.Default()
	p.Spec.Exemptions.Namespaces = []string{"gpu-operator"}
	p.Spec.Exemptions.ServiceAccounts = []config.ServiceAccountRef{{Namespace: "gpu-infra", Name: "dcgm-exporter"}}
	e := &Exemptions{Client: client}
	e.Set(p, []string{"monitoring"})
	ctx := context.Background()
	for _, c := range []struct {
		c    Container
		want string
	}{
		{Container{PodUID: "u-1", Key: key("gpu-infra", "dcgm", "exporter")}, "service account gpu-infra/dcgm-exporter"},
		{Container{PodUID: "u-1", Key: key("gpu-infra", "dcgm", "exporter")}, "service account gpu-infra/dcgm-exporter"},
		{Container{PodUID: "u-2", Key: key("gpu-infra", "tenant", "main")}, ""}, // runs as default
		{Container{PodUID: "u-9", Key: key("gpu-infra", "gone", "main")}, ""},
		{Container{Key: key("gpu-operator", "plugin", "main")}, "namespace gpu-operator"},
		{Container{Key: key("monitoring", "exporter", "main")}, "namespace monitoring"},
	} {
		if got := e.Of(ctx, c.c); got != c.want {
			t.Errorf("%s: exemption %q, want %q", c.c.Key, got, c.want)
		}
	}
	if gets != 3 {
		t.Errorf("%d pod reads, want 3: once per pod, namespaces without a read", gets)
	}
}
