// Package webhook serves gpuguard's policy engine to the Kubernetes API server: the
// /mutate and /validate admission handlers, the policy source (a ConfigMap watched
// live, or a file), namespace labels, on-demand ConfigMap reads for envFrom
// inspection, certificates, metrics and probes. The handlers only translate between
// AdmissionReviews and the engine; no decision is made here.
package webhook
