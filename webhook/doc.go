// Package webhook serves gpuguard's policy engine to the Kubernetes API server:
// the /mutate and /validate admission handlers, metrics, probes and the wiring
// of the parts below. The handlers only translate between AdmissionReviews and
// the engine (package policy); no decision is made here.
//
// Everything only the webhook uses lives beneath it:
//
//   - policysource: the policy in force, kept in step with its ConfigMap;
//   - lookup: namespace labels, the ConfigMaps envFrom names, and the nodes pods are created bound to;
//   - hardening: whether every GPU node reports itself hardened
//     (inject-void=auto);
//   - backstop: keeps the CEL backstop (package cel) applied;
//   - prefilter: keeps the pre-filter on the webhook configurations;
//   - backgroundaudit and reports: judges what already runs, as OpenReports;
//   - servingcert: the serving certificate, when gpuguard manages it.
package webhook
