package policy

import (
	"context"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

type nodes map[string]corev1.ResourceList

func (ns nodes) NodeAllocatable(_ context.Context, name string) (corev1.ResourceList, error) {
	if name == "broken" {
		return nil, errors.New("timeout")
	}
	if a, ok := ns[name]; ok {
		return a, nil
	}
	return nil, ErrNodeNotFound
}

func TestCheckUnhonouredGPURequest(t *testing.T) {
	bound := func(node string) *corev1.Pod {
		p := podOf(ctr("a"), gpuCtr("g"))
		p.Spec.NodeName = node
		return p
	}
	ns := nodes{"gpu": {"nvidia.com/gpu": resource.MustParse("8")}, "cpu": {"cpu": resource.MustParse("8")}}
	dropped := `asks for GPU resources that node %s does not advertise: the kubelet drops such a request and allocates nothing, ` +
		"so it is judged as a container without GPUs (and gets NVIDIA_VISIBLE_DEVICES=void); let the scheduler place the pod"
	runRuleTable(t, []ruleCase{
		{name: "scheduled", req: Request{Nodes: ns, Object: bound("")}},
		{name: "offline", req: Request{Object: bound("cpu")}},
		{name: "advertised", req: Request{Nodes: ns, Object: bound("gpu")}},
		{name: "not advertised", req: Request{Nodes: ns, Object: bound("cpu")},
			want: []found{{RuleUnhonouredGPURequest, effectWarn, "g", "spec.nodeName", sprintf(dropped, `"cpu"`), editNoGPU}}},
		{name: "unknown node", req: Request{Nodes: ns, Object: bound("new")},
			want: []found{{RuleUnhonouredGPURequest, effectWarn, "g", "spec.nodeName", sprintf(dropped, `"new"`), editNoGPU}}},
		{name: "unreadable node", req: Request{Nodes: ns, Object: bound("broken")},
			want: []found{{RuleUnhonouredGPURequest, effectDeny, "", "spec.nodeName",
				`cannot tell whether node "broken" advertises the GPU resources the pod asks for: timeout; retry`, editNone}}},
	}, checkUnhonouredGPURequest, nil)
}
