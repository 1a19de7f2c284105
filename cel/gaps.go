package cel

import "github.com/gpuguard/gpuguard/policy"

// Gap is a part of the policy that only the webhook enforces: a rule's (its
// Gap in the registry), or one of the backstop as a whole (Rule names the
// part then).
type Gap struct {
	Rule policy.RuleID
	Why  string
}

// requestGaps are what the backstop as a whole leaves to the webhook,
// whatever the rule.
var requestGaps = []Gap{
	{"pods-binding", "a Binding's annotations (`pods/binding` and `bindings`, which only the scheduler is usually allowed to create): the backstop's expressions read a pod, and a Binding has no spec"},
	{"pod-controllers", "Deployments, Jobs and the other controllers are not judged through their templates; their pods are"},
	{"strip", "action `strip`: CEL cannot remove env entries, so the backstop denies what the webhook would strip"},
	{"none-rewrite", "`NVIDIA_VISIBLE_DEVICES=none` is not rewritten in place; `void` is appended after it, with the same effect"},
	{"messages", "denials name the rule, not the container or the field path (a message that named the container would cost as much again as the validations on every pod judged); no audit annotations or warnings beyond the binding's action"},
}

// WebhookOnly lists what the CEL backstop leaves to the webhook, and why: each
// registered rule's gap, in the rules' order, then the backstop's own.
var WebhookOnly = webhookOnly()

func webhookOnly() []Gap {
	var gaps []Gap
	for _, r := range policy.Registry() {
		if r.Gap != "" {
			gaps = append(gaps, Gap{Rule: r.ID, Why: r.Gap})
		}
	}
	return append(gaps, requestGaps...)
}
