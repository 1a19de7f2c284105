{{/*
The webhook's service account and grants, for a role (include with (dict "ctx"
$ "role" ROLE)): serve reads what reviews need and writes nothing of admission
configuration; control holds the writes (certificate and CA bundle, CEL
backstop, pre-filter, background audit); all holds both.
*/}}
{{- define "gpuguard.webhookRBAC" -}}
{{- $ctx := .ctx -}}
{{- $role := .role -}}
{{- $applies := ne $role "serve" -}}
{{- $selfManaged := eq $ctx.Values.certificates.mode "self-managed" -}}
{{- $name := ternary (include "gpuguard.controllerName" $ctx) (include "gpuguard.webhookName" $ctx) (eq $role "control") -}}
{{- $component := ternary "controller" "webhook" (eq $role "control") -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ $name }}
  namespace: {{ $ctx.Release.Namespace }}
  labels:
    {{- include "gpuguard.componentLabels" (dict "ctx" $ctx "component" $component) | nindent 4 }}
  {{- with $ctx.Values.webhook.serviceAccount.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
---
# Cluster-wide permissions of the {{ $component }}. Nothing else is granted.
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {{ $name }}
  labels:
    {{- include "gpuguard.componentLabels" (dict "ctx" $ctx "component" $component) | nindent 4 }}
rules:
  # Namespace labels (gpuguard.io/mode) from a metadata-only watch, and a check
  # that the namespaces the policy exempts exist.
  - apiGroups: [""]
    resources: ["namespaces"]
    verbs: ["get", "list", "watch"]
  {{- if eq (include "gpuguard.configMapReads" $ctx) "true" }}
  # envFrom inspection: the ConfigMap a GPU container names is read once, on
  # demand, in that pod's namespace. get only: no list, no watch, no Secrets.
  - apiGroups: [""]
    resources: ["configmaps"]
    verbs: ["get"]
  {{- end }}
  {{- if and $applies (eq (include "gpuguard.backstop" $ctx) "true") }}
  # The CEL backstop, applied by the webhook from the live policy with
  # server-side apply of its own four objects. Creates are narrowed by name
  # too: the API server authorizes the create an apply implies with the
  # object's name (k8s.io/apiserver endpoints/handlers/patch.go), so a
  # compromised webhook pod cannot write an admission policy of another name.
  - apiGroups: ["admissionregistration.k8s.io"]
    resources: ["validatingadmissionpolicies", "validatingadmissionpolicybindings", "mutatingadmissionpolicies", "mutatingadmissionpolicybindings"]
    resourceNames: [{{ include "gpuguard.backstopName" $ctx | quote }}]
    verbs: ["get", "create", "patch"]
  {{- end }}
  {{- if and $applies (or (eq (include "gpuguard.backstop" $ctx) "true") (eq (include "gpuguard.kaiGuardOnly" $ctx) "true")) }}
  # The ConfigMap guard of the KAI fraction integration: applied while the
  # policy turns it on, deleted when it is turned off (docs/compatibility.md).
  - apiGroups: ["admissionregistration.k8s.io"]
    resources: ["validatingadmissionpolicies", "validatingadmissionpolicybindings"]
    resourceNames: [{{ printf "%s-kai-configmaps" (include "gpuguard.backstopName" $ctx) | quote }}]
    verbs: ["get", "create", "patch", "delete"]
  {{- end }}
  {{- if $applies }}
  # The webhook registers its own two webhook configurations once a replica
  # is ready, server-side apply; creates are narrowed by name as well (the
  # API server authorizes the create an apply implies with the object's
  # name), so this account can write no other webhook configuration.
  - apiGroups: ["admissionregistration.k8s.io"]
    resources: ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"]
    resourceNames: [{{ include "gpuguard.webhookConfigName" $ctx | quote }}]
    verbs: ["get", "create", "patch"]
  # The owner of the configurations and of the backstop, this ClusterRole:
  # helm uninstall deletes it and the garbage collector takes them with it,
  # while deleting the webhook configurations (the runbook step when a
  # webhook blocks a cluster) leaves the backstop in force.
  - apiGroups: ["rbac.authorization.k8s.io"]
    resources: ["clusterroles"]
    resourceNames: [{{ $name | quote }}]
    verbs: ["get"]
  {{- end }}
  # A pod created bound to a node (spec.nodeName): does that node advertise
  # the GPU resources it asks for (unhonoured-gpu-request)? Read one by one.
  - apiGroups: [""]
    resources: ["nodes"]
    verbs: ["get"]
  {{- if eq $ctx.Values.admission.injectVoid "auto" }}
  # The hardened-cluster profile reads the GPU nodes' labels (metadata only).
  - apiGroups: [""]
    resources: ["nodes"]
    verbs: ["list", "watch"]
  # ...and which nodes a GPU DRA driver publishes devices on (ResourceSlices,
  # in whichever version the API server serves).
  - apiGroups: ["resource.k8s.io"]
    resources: ["resourceslices"]
    verbs: ["list", "watch"]
  {{- end }}
  {{- /* The pre-filter's server-side apply of one match condition on
  gpuguard's own pod webhooks needs get and patch: granted above. */}}
  {{- if and $applies $ctx.Values.audit.enabled }}
  # The background audit reads every pod and pod controller (list, no watch).
  - apiGroups: [""]
    resources: ["pods", "replicationcontrollers", "podtemplates"]
    verbs: ["list"]
  - apiGroups: ["apps"]
    resources: ["deployments", "replicasets", "statefulsets", "daemonsets"]
    verbs: ["list"]
  - apiGroups: ["batch"]
    resources: ["jobs", "cronjobs"]
    verbs: ["list"]
  {{- if $ctx.Values.reports.enabled }}
  # ...and writes its results as one OpenReports Report per namespace.
  - apiGroups: ["openreports.io"]
    resources: ["reports"]
    verbs: ["get", "list", "create", "update", "delete"]
  {{- end }}
  {{- end }}
  {{- if and $applies $selfManaged }}
  # Self-managed certificates: the certificate controller watches the webhook
  # configurations (cluster-scoped, so list/watch cannot be narrowed by name)...
  - apiGroups: ["admissionregistration.k8s.io"]
    resources: ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"]
    verbs: ["list", "watch"]
  # ...and writes the CA bundle into gpuguard's two configurations only.
  - apiGroups: ["admissionregistration.k8s.io"]
    resources: ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"]
    resourceNames: [{{ include "gpuguard.webhookConfigName" $ctx | quote }}]
    verbs: ["update"]
  {{- end }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{ $name }}
  labels:
    {{- include "gpuguard.componentLabels" (dict "ctx" $ctx "component" $component) | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {{ $name }}
subjects:
  - kind: ServiceAccount
    name: {{ $name }}
    namespace: {{ $ctx.Release.Namespace }}
---
# Permissions of the webhook in its own namespace.
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{ $name }}
  namespace: {{ $ctx.Release.Namespace }}
  labels:
    {{- include "gpuguard.componentLabels" (dict "ctx" $ctx "component" $component) | nindent 4 }}
rules:
  # The policy ConfigMap, watched through a field selector on its name, so
  # list/watch are narrowed to it as well.
  - apiGroups: [""]
    resources: ["configmaps"]
    resourceNames: [{{ include "gpuguard.policyConfigMap" $ctx | quote }}]
    verbs: ["get", "list", "watch"]
  # Events (PolicyLoaded, PolicyInvalid, PolicyMissing) on the policy ConfigMap,
  # written through the events.k8s.io API (create, then patch for a series).
  - apiGroups: ["events.k8s.io"]
    resources: ["events"]
    verbs: ["create", "patch"]
  {{- if $applies }}
  # Whether a replica is ready, before the webhook configurations are
  # registered: the EndpointSlices of the webhook's Service (selected by
  # label, which resourceNames cannot narrow).
  - apiGroups: ["discovery.k8s.io"]
    resources: ["endpointslices"]
    verbs: ["list", "watch"]
  {{- end }}
  {{- if and $applies $ctx.Values.audit.enabled }}
  # The Lease through which one replica is elected to run the background audit.
  - apiGroups: ["coordination.k8s.io"]
    resources: ["leases"]
    verbs: ["create"]
  - apiGroups: ["coordination.k8s.io"]
    resources: ["leases"]
    resourceNames: ["gpuguard-audit"]
    verbs: ["get", "update"]
  {{- end }}
  {{- if eq $ctx.Values.admission.injectVoid "auto" }}
  # The agents' Leases: a GPU node whose node enforcer holds a fresh one
  # counts as covered for the hardened-cluster profile, and its hardened mark
  # counts only while its agent holds a fresh one of its own.
  - apiGroups: ["coordination.k8s.io"]
    resources: ["leases"]
    verbs: ["list", "watch"]
  {{- end }}
  {{- if and (not $applies) $selfManaged }}
  # Self-managed certificates: the serving certificate is read from the one
  # Secret the controller keeps (list and watch through a field selector on
  # its name, which resourceNames narrow too); nothing is written.
  - apiGroups: [""]
    resources: ["secrets"]
    resourceNames: [{{ include "gpuguard.tlsSecret" $ctx | quote }}]
    verbs: ["get", "list", "watch"]
  {{- end }}
  {{- if and $applies $selfManaged }}
  # Self-managed certificates: the certificate controller caches the Secrets of
  # this namespace (its cache is not narrowed to one name)...
  - apiGroups: [""]
    resources: ["secrets"]
    verbs: ["list", "watch"]
  # ...and writes the CA and serving certificate into gpuguard's Secret only.
  - apiGroups: [""]
    resources: ["secrets"]
    resourceNames: [{{ include "gpuguard.tlsSecret" $ctx | quote }}]
    verbs: ["update"]
  {{- end }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{ $name }}
  namespace: {{ $ctx.Release.Namespace }}
  labels:
    {{- include "gpuguard.componentLabels" (dict "ctx" $ctx "component" $component) | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: {{ $name }}
subjects:
  - kind: ServiceAccount
    name: {{ $name }}
    namespace: {{ $ctx.Release.Namespace }}
{{- end -}}
