package cel

import "github.com/gpuguard/gpuguard/policy"

// Gap is a part of the policy that only the webhook enforces.
type Gap struct {
	Rule policy.RuleID
	Why  string
}

// WebhookOnly lists what the CEL backstop leaves to the webhook, and why.
var WebhookOnly = []Gap{
	{policy.RuleEnvFromUnprefixed, "inspecting a ConfigMap's keys needs to read it; CEL sees only the pod (rendered only when the policy denies every unprefixed envFrom on GPU containers)"},
	{policy.RuleDeviceListMount, "mount paths that need cleaning (\"..\", \"//\", \"./\"): CEL has no path.Clean, so they are left to the webhook rather than judged wrongly"},
	{policy.RuleSensitiveHostPath, "host paths that need cleaning (\"..\", \"//\", \"./\"), for the same reason"},
	{policy.RuleNamespaceMode, "the gpuguard.io/mode namespace label: namespaces whose label relaxes the mode are left out of the validating binding, and a label that tightens it is not honoured (the binding applies the policy's own mode)"},
	{policy.RulePrivileged, "warnings: rendered only when the policy's severity is deny (the default)"},
	{policy.RuleCapabilities, "warnings: rendered only when the policy's severity is deny"},
	{policy.RuleInjectorAnnotation, "a warning only: the backstop renders what denies"},
	{"pods-binding", "a Binding's annotations (pods/binding and bindings, which only the scheduler is usually allowed to create): the backstop's expressions read a pod, and a Binding has no spec"},
	{policy.RuleNVIDIARuntimeClass, "warnings: rendered only when the policy's severity is deny"},
	{policy.RuleFinalState, "the warning for mirror pods (they are skipped)"},
	{"pod-controllers", "Deployments, Jobs and other controllers are not judged through their templates; their pods are"},
	{"strip", "action strip: CEL cannot remove env entries, so the backstop denies what the webhook would strip"},
	{"none-rewrite", "NVIDIA_VISIBLE_DEVICES=none is not rewritten in place; void is appended after it, with the same effect"},
	{"messages", "denials name the rule and the container, not the field path; no audit annotations or warnings beyond the binding's action"},
}
