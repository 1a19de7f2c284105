package enforcer

import (
	"context"
	"maps"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpuguard/gpuguard/agent/verifier"
	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/policy"
)

// TestDecideKAIFractions: a KAI fraction container keeps the device list
// its ConfigMap gives it only where it names the GPUs the kubelet
// allocated to its GPU group's reservation pod (KAIBound); a list naming
// anything else, a GPU node beyond them, and a fraction whose reservation
// pod cannot be found are refused.
func TestDecideKAIFractions(t *testing.T) {
	r := testRules(t)
	boundB := Facts{KAIFraction: true, KAIBound: []string{"GPU-b"}}
	for _, tc := range []struct {
		name   string
		c      Container
		f      Facts
		setEnv map[string]string
		// refuse: words the refusal holds, in order.
		refuse []string
	}{
		{name: "its own GPU by UUID: kept", c: Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=GPU-b"}, Devices: gpuNodes(1)}, f: boundB},
		{name: "its own GPU by index: kept", c: Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=1"}}, f: boundB},
		{name: "its own GPU by CDI name, as KAI writes it for a CDI device plugin: kept",
			c: Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=k8s.device-plugin.nvidia.com/gpu=GPU-b"}}, f: boundB},
		{name: "another GPU than its group's reservation: refused, naming the variable and the bound GPU",
			c: Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=GPU-a"}}, f: boundB, refuse: []string{"NVIDIA_VISIBLE_DEVICES", `"GPU-a"`, "GPU-b, the GPU KAI bound it to"}},
		{name: "its GPU and another by CDI name: refused",
			c: Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=k8s.device-plugin.nvidia.com/gpu=GPU-b,k8s.device-plugin.nvidia.com/gpu=GPU-a"}}, f: boundB,
			refuse: []string{"NVIDIA_VISIBLE_DEVICES", "GPU-b, the GPU KAI bound it to"}},
		{name: "every GPU: refused", c: Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}}, f: boundB, refuse: []string{`"all"`}},
		{name: "another GPU's device node: refused", c: Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=GPU-b"}, Devices: gpuNodes(1, 0)},
			f: boundB, refuse: []string{"/dev/nvidia0"}},
		{name: "a fraction spanning two GPUs: both kept",
			c: Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b"}}, f: Facts{KAIFraction: true, KAIBound: []string{"GPU-a", "GPU-b"}}},
		{name: "no reservation pod found: refused, saying why",
			c: Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=GPU-b"}},
			f: Facts{KAIFraction: true, KAIUnbound: "no reservation pod of its GPU group g1 runs on this node"}, refuse: []string{"GPU group g1"}},
		{name: "no binding at all: refused", c: Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=GPU-b"}}, f: Facts{KAIFraction: true},
			refuse: []string{"KAI Scheduler fraction"}},
		{name: "neighbour that is no fraction, the same list: void", c: Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=GPU-b"}},
			setEnv: map[string]string{"NVIDIA_VISIBLE_DEVICES": Void}},
		{name: "an exemption waiving inject-void keeps a fraction's list unread",
			c: Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=GPU-a"}},
			f: Facts{KAIFraction: true, Exempt: "service account team-a/x", Waived: policy.RuleSet{policy.RuleInjectVoid: true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := r.Decide(tc.c, tc.f)
			if len(tc.refuse) > 0 {
				rest := d.Refuse
				for _, word := range tc.refuse {
					i := strings.Index(rest, word)
					if i < 0 {
						t.Fatalf("refusal %q, want one naming %q", d.Refuse, tc.refuse)
					}
					rest = rest[i+len(word):]
				}
				return
			}
			if d.Refuse != "" {
				t.Fatalf("refused: %s", d.Refuse)
			}
			if !maps.Equal(d.SetEnv, tc.setEnv) && (len(d.SetEnv) > 0 || len(tc.setEnv) > 0) {
				t.Errorf("set %v, want %v", d.SetEnv, tc.setEnv)
			}
		})
	}
}

// kaiPod is a fraction pod KAI scheduled, bound to GPU group group.
func kaiPod(name, group string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name, UID: types.UID("uid-" + name),
		Annotations: map[string]string{policy.KAIFractionAnnotation: "0.5"}, Labels: map[string]string{policy.KAIGPUGroupLabel: group}},
		Spec: corev1.PodSpec{SchedulerName: "kai-scheduler", Containers: []corev1.Container{{Name: "main"}}}}
}

// reservationPod is KAI's reservation pod of group.
func reservationPod(name, group string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: config.DefaultKAIReservationNamespace, Name: name,
		Labels: map[string]string{policy.KAIGPUGroupLabel: group}}}
}

// TestKAIFractionsHeldToTheirReservation: through the plugin, with the
// API server's pods and the kubelet's allocations, a fraction container
// whose ConfigMap names its group's reservation GPU is created as it is,
// one naming another GPU is refused naming its group's, and one whose
// group has no reservation pod on the node is refused.
func TestKAIFractionsHeldToTheirReservation(t *testing.T) {
	client := fake.NewClientset(kaiPod("own", "g1"), kaiPod("other", "g1"), kaiPod("lost", "g3"),
		reservationPod("gpu-reservation-node-aaaaa", "g1"), reservationPod("gpu-reservation-node-bbbbb", "g2"))
	pol := config.Default()
	pol.Spec.Integrations.KAIScheduler.Fractions = true
	ex := &verifier.Exemptions{Client: client}
	ex.Set(pol, nil)
	built, err := NewRules(pol, testNode())
	if err != nil {
		t.Fatal(err)
	}
	rules := &atomic.Pointer[Rules]{}
	rules.Store(built)
	decisions, latency := NewMetrics(prometheus.NewRegistry())
	ns := config.DefaultKAIReservationNamespace
	kubelet := fixedAllocations{
		{Namespace: ns, Pod: "gpu-reservation-node-aaaaa", Container: "resource-reservation"}: {"nvidia.com/gpu": {"GPU-b"}},
		{Namespace: ns, Pod: "gpu-reservation-node-bbbbb", Container: "resource-reservation"}: {"nvidia.com/gpu": {"GPU-a"}},
	}
	p := &Plugin{Rules: rules, Allocations: kubelet, Exemptions: ex, Log: logr.Discard(), Decisions: decisions, Latency: latency}
	for _, tc := range []struct {
		pod, env, want, refusing string
	}{
		{pod: "own", env: "NVIDIA_VISIBLE_DEVICES=GPU-b"},
		{pod: "other", env: "NVIDIA_VISIBLE_DEVICES=GPU-a", refusing: `is "GPU-a", which names more than GPU-b`},
		{pod: "lost", env: "NVIDIA_VISIBLE_DEVICES=GPU-a", refusing: "no reservation pod of its GPU group g3 runs on this node in namespace " + ns},
	} {
		req := createRequest(tc.pod, "main", tc.env)
		adj, _, err := p.CreateContainer(context.Background(), req.Pod, req.Container)
		switch {
		case tc.refusing != "":
			if err == nil || !strings.Contains(err.Error(), tc.refusing) {
				t.Errorf("%s: %v, want refused naming %q", tc.pod, err, tc.refusing)
			}
			continue
		case err != nil:
			t.Errorf("%s: %v", tc.pod, err)
			continue
		}
		env := envOf(adj)
		if got := env["NVIDIA_VISIBLE_DEVICES"]; got != tc.want {
			t.Errorf("%s: NVIDIA_VISIBLE_DEVICES adjusted to %q, want %q", tc.pod, got, tc.want)
		}
	}
}
