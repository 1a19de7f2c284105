package cel

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/policy"
	"github.com/gpuguard/gpuguard/policy/celexpr"
)

// PrefilterName names the match condition that keeps pods with nothing for
// gpuguard to do from its webhooks and its backstop.
const PrefilterName = "gpuguard-has-work"

// Prefilter is a CEL condition over an admission request that holds
// whenever the policy may have anything to say about it: every registered
// rule's trigger, ORed. A pod for which it does not hold is one the engine
// admits unchanged, without a warning (TestPrefilterIsSafe holds it against
// the engine on every fixture, and FuzzParity on generated pods), so
// neither the webhooks nor the backstop need to see it. Requests for other
// kinds (a Binding, a pod controller) always pass.
//
// It reads only object, oldObject and request, so the API server can
// evaluate it as a webhook's or a policy's match condition. A pod that needs
// NVIDIA_VISIBLE_DEVICES=void passes (inject-void's trigger), and one that
// has it does not: after the MutatingAdmissionPolicy has injected it, the
// webhooks see no more of an ordinary pod.
func Prefilter(p *config.Policy) (string, error) {
	r, err := newRules(p)
	if err != nil {
		return "", err
	}
	return r.hasWork, nil
}

// InjectionPrefilterName names the MutatingAdmissionPolicy's match
// condition: the pre-filter of the rules it acts for alone.
const InjectionPrefilterName = "gpuguard-has-injection-work"

// prefilter ORs the triggers of every registered rule.
func (r *rules) prefilter() string {
	return r.prefilterOf(func(*policy.Rule) bool { return true })
}

// injectionPrefilter ORs the triggers that cover what the
// MutatingAdmissionPolicy patches: inject-void's (a container without an
// entry for a device variable), device-env's (an entry that is not void) and
// pin-parent-groups' (a host path). It changes nothing of a pod for which
// none holds, so it need not evaluate the other rules' triggers, which an
// ordinary pod needing its void would otherwise pay for in full. Parity
// holds the policy's patches to the engine's on every fixture.
func (r *rules) injectionPrefilter() string {
	return r.prefilterOf(func(rule *policy.Rule) bool {
		return slices.Contains([]policy.RuleID{policy.RuleInjectVoid, policy.RuleDeviceEnv, policy.RulePinParentGroups}, rule.ID)
	})
}

// prefilterOf ORs the triggers of the registered rules keep selects.
func (r *rules) prefilterOf(keep func(*policy.Rule) bool) string {
	in := r.input()
	var pods, containers, env, envNames []string
	anyName := false
	add := func(list *[]string, pred string) {
		if pred != "" && !slices.Contains(*list, pred) {
			*list = append(*list, pred)
		}
	}
	for _, rule := range policy.Registry() {
		if rule.Trigger == nil || !keep(rule) {
			continue
		}
		if t := rule.Trigger(in); t != nil {
			add(&pods, t.Pod)
			add(&containers, t.Container)
			add(&env, t.Env)
			if t.Env != "" {
				envNames = append(envNames, t.EnvNames...)
				anyName = anyName || len(t.EnvNames) == 0
			}
		}
	}
	if len(env) > 0 {
		// One pass over each container's env for every rule that reads it,
		// behind one test of the name where every name those rules read
		// shares a prefix (NVIDIA_): most of a pod's entries are not NVIDIA's.
		pass := celexpr.Or(env...)
		if prefix := commonPrefix(envNames); !anyName && len(prefix) > 1 {
			pass = fmt.Sprintf("e.name.startsWith(%s) && (%s)", celexpr.Str(prefix), pass)
		}
		containers = append([]string{"has(c.env) && c.env.exists(e, " + pass + ")"}, containers...)
	}
	if len(containers) > 0 {
		anyTrigger := celexpr.Or(containers...)
		for _, l := range containerLists {
			pods = append(pods, fmt.Sprintf("has(object.spec.%[1]s) && object.spec.%[1]s.exists(c, %[2]s)", l.field, anyTrigger))
		}
	}
	return `request.kind.kind != "Pod" || ` + celexpr.Or(pods...)
}

// commonPrefix is the longest prefix every name shares; "" for none.
func commonPrefix(names []string) string {
	if len(names) == 0 {
		return ""
	}
	prefix := names[0]
	for _, n := range names[1:] {
		for !strings.HasPrefix(n, prefix) {
			prefix = prefix[:len(prefix)-1]
		}
	}
	return prefix
}
