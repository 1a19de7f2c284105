// Package cel renders a gpuguard policy as Kubernetes admission policies evaluated
// inside the API server: a ValidatingAdmissionPolicy for the rules CEL can express
// exactly, and a MutatingAdmissionPolicy for the void injection, each with its
// binding. They are a backstop: when the webhook is unreachable, the core
// guarantees still hold, with no network hop and no availability of their own to
// lose. What CEL cannot express exactly is left to the webhook and listed in
// WebhookOnly, never approximated in a way that could deny a pod the webhook allows.
//
// Prefilter renders the webhooks' pre-filter, the match condition that keeps
// pods with nothing to judge away from them. Beneath this package, celeval
// evaluates what is rendered in-process with the API server's own admission
// libraries (the parity tests), and celcost measures what it costs the API
// server at runtime. The webhook keeps both applied (webhook/backstop,
// webhook/prefilter).
package cel
