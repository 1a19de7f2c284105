package policy

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuguard/gpuguard/config"
)

func TestCheckFinalState(t *testing.T) {
	msg := "no GPU limit and no NVIDIA_VISIBLE_DEVICES=void (gpuguard's mutation did not run); add it or retry"
	mirror := podOf(ctr("a"))
	mirror.ObjectMeta = metav1.ObjectMeta{Name: "m", Annotations: map[string]string{MirrorPodAnnotation: "x"}}
	runRuleTable(t, []ruleCase{
		{name: "void, last entry wins", req: Request{Object: podOf(ctr("a", envVar("NVIDIA_VISIBLE_DEVICES", "all"), envVar("NVIDIA_VISIBLE_DEVICES", "void")), gpuCtr("g"))}},
		{name: "mutating phase", req: mutating(podOf(ctr("a")))},
		{name: "injection off", policy: func(s *config.PolicySpec) { s.InjectVoid = false }, req: Request{Object: podOf(ctr("a"))}},
		{name: "missing", req: Request{Object: podOf(ctr("a", envVar("NVIDIA_VISIBLE_DEVICES", "void"), envVar("NVIDIA_VISIBLE_DEVICES", "0")))},
			want: []found{{RuleFinalState, effectDeny, "a", "spec.containers[0].env", msg, editNone}}},
		{name: "mirror pod warns", req: Request{Object: mirror},
			want: []found{{RuleFinalState, effectWarn, "a", "spec.containers[0].env", msg, editNone}}},
	}, nil, checkFinalState)
}
