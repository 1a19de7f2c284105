package policy

import (
	"testing"

	"github.com/gpuguard/gpuguard/config"
)

func TestCheckInjectorAnnotations(t *testing.T) {
	runRuleTable(t, []ruleCase{
		{name: "no suspect label", req: Request{Object: withAnnotations(podOf(ctr("a")), map[string]string{"example.com/devicesx": "y"})}},
		{name: "denied, and ignored prefixes", req: Request{Object: withAnnotations(podOf(ctr("a")), map[string]string{"cdi.k8s.io/a": "x", "cdi.kubevirt.io/b": "y"})}},
		{name: "suspect domain label", req: Request{Object: withAnnotations(podOf(ctr("a")), map[string]string{"Mounts.Example.com/a": "x"})},
			want: []found{{RuleInjectorAnnotation, effectWarn, "", "metadata.annotations[Mounts.Example.com/a]",
				"looks like an unlisted device injector's annotation; deny or ignore it in the policy", editNone}}},
		{name: "no labels listed", policy: func(s *config.PolicySpec) { s.Annotations.SuspectDomainLabels = nil },
			req: Request{Object: withAnnotations(podOf(ctr("a")), map[string]string{"devices.example.com/a": "x"})}},
	}, checkInjectorAnnotations, nil)
}
