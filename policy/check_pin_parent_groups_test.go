package policy

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuguard/gpuguard/config"
)

func TestPinParentGroups(t *testing.T) {
	pinnable := hostPathPod("/var/lib", true, ctr("plain"), withSC(ctr("a"), unprivileged()))
	pinnable.Spec.Containers[0].VolumeMounts = nil
	template := &appsv1.Deployment{Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{Spec: pinnable.Spec}}}
	runRuleTable(t, []ruleCase{
		{name: "validating phase of a pod", req: Request{Object: pinnable}},
		{name: "parents denied", policy: func(s *config.PolicySpec) { s.SensitiveHostPathParents = config.ParentsDeny }, req: mutating(pinnable)},
		{name: "root mounting: all or nothing", req: mutating(hostPathPod("/var/lib", true, withSC(ctr("a"), unprivileged()), ctr("root")))},
		{name: "pinned", req: mutating(pinnable),
			want: []found{{RulePinParentGroups, effectNone, "", "", "", editPinGroups}}},
		{name: "template: planned, and said", req: Request{Object: template},
			want: []found{
				{RulePinParentGroups, effectNone, "", "", "", editPinGroups},
				{RulePinParentGroups, effectWarn, "", "spec.template.spec.securityContext.supplementalGroupsPolicy",
					"its pods get Strict, for the host path parent it mounts", editNone},
				{RulePinParentGroups, effectWarn, "", "spec.template.spec.containers[1].securityContext.runAsGroup",
					"its pods get 65534 (nogroup), for the host path parent it mounts", editNone},
			}},
	}, pinParentGroups, nil)
}

func TestPlanGroupPins(t *testing.T) {
	in := inputOf(t, nil, mutating(hostPathPod("/var/lib", true, ctr("plain"), withSC(ctr("a"), unprivileged()))))
	// "plain" mounts the parent too, as root: nothing is pinned.
	if _, ok := in.planGroupPins(); ok {
		t.Error("pinned a pod with a root container mounting the parent")
	}
	p := hostPathPod("/var/lib", true, withSC(ctr("a"), unprivileged()))
	p.Spec.Containers = append([]corev1.Container{ctr("plain")}, p.Spec.Containers...)
	in = inputOf(t, nil, mutating(p))
	pins, ok := in.planGroupPins()
	if !ok || !pins.strict || len(pins.group) != 1 || pins.group[0] != 1 {
		t.Errorf("pins %+v, %v; want Strict and container 1's group", pins, ok)
	}
}
