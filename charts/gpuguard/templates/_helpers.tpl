{{/* Chart name. */}}
{{- define "gpuguard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: the prefix of every object name (at most 45 characters, so that suffixes fit). */}}
{{- define "gpuguard.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 45 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 45 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 45 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gpuguard.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "gpuguard.labels" -}}
helm.sh/chart: {{ include "gpuguard.chart" . }}
app.kubernetes.io/name: {{ include "gpuguard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpuguard
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: include with (dict "ctx" $ "component" "webhook"). */}}
{{- define "gpuguard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuguard.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "gpuguard.componentLabels" -}}
{{ include "gpuguard.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Image reference: include with (dict "image" .Values.webhook.image "ctx" $). A digest pins the image. */}}
{{- define "gpuguard.image" -}}
{{- $tag := .image.tag | default .ctx.Chart.AppVersion -}}
{{- if .image.digest -}}
{{- printf "%s@%s" .image.repository .image.digest -}}
{{- else -}}
{{- printf "%s:%s" .image.repository $tag -}}
{{- end -}}
{{- end -}}

{{- define "gpuguard.webhookName" -}}{{ include "gpuguard.fullname" . }}-webhook{{- end -}}
{{- define "gpuguard.controllerName" -}}{{ include "gpuguard.fullname" . }}-controller{{- end -}}
{{/* The ClusterRole that owns the CEL backstop: that of the pods that apply it. */}}
{{- define "gpuguard.backstopOwner" -}}
{{- if .Values.webhook.controller.enabled }}{{ include "gpuguard.controllerName" . }}{{ else }}{{ include "gpuguard.webhookName" . }}{{ end -}}
{{- end -}}
{{- define "gpuguard.agentName" -}}{{ include "gpuguard.fullname" . }}-agent{{- end -}}
{{- define "gpuguard.webhookConfigName" -}}{{ include "gpuguard.fullname" . }}{{- end -}}
{{- define "gpuguard.webhookConfigurationsConfigMap" -}}{{ include "gpuguard.fullname" . }}-webhook-configurations{{- end -}}
{{- define "gpuguard.policyConfigMap" -}}{{ .Values.policy.configMapName | default (printf "%s-policy" (include "gpuguard.fullname" .)) }}{{- end -}}

{{/* The Secret the webhook serves its certificate from. */}}
{{- define "gpuguard.tlsSecret" -}}
{{- if eq .Values.certificates.mode "secret" -}}
{{- required "certificates.existingSecret.name is required with certificates.mode=secret" .Values.certificates.existingSecret.name -}}
{{- else -}}
{{- .Values.certificates.secretName | default (printf "%s-webhook-tls" (include "gpuguard.fullname" .)) -}}
{{- end -}}
{{- end -}}

{{- define "gpuguard.certificateName" -}}{{ include "gpuguard.fullname" . }}-webhook{{- end -}}

{{/*
The policy document the ConfigMap holds.
- nothing set: the chart's copy of the built-in default, byte for byte but
  for its mode, warn;
- policy.document: that text, its own mode included (none: enforce, the
  built-in one);
- otherwise a document with only the fields set (mode, spec, presets): a field
  left out keeps the built-in default of the running gpuguard, but for the
  mode, warn unless policy.mode or policy.spec.mode sets it.
The chart's mode is warn so that a first install denies nothing: a team
turns enforce on once warn has shown what it would deny.
*/}}
{{- define "gpuguard.policyDocument" -}}
{{- $p := .Values.policy -}}
{{- $pairs := include "gpuguard.presetExemptions" . | fromYamlArray -}}
{{- $sharing := list -}}
{{- range $name := list "hami" "volcanoVGPU" "aliyunGPUShare" -}}
{{- $preset := get $p.presets $name -}}
{{- if $preset.enabled -}}{{- $sharing = concat $sharing $preset.resources -}}{{- end -}}
{{- end -}}
{{- $kai := $p.presets.kaiScheduler -}}
{{- $presets := or (gt (len $pairs) 0) (gt (len $sharing) 0) $kai.enabled -}}
{{- if $p.document -}}
{{- if or $p.mode $p.spec $presets -}}
{{- fail "policy.document is a complete policy: do not combine it with policy.mode, policy.spec or policy.presets (put those settings into the document)" -}}
{{- end -}}
{{- $p.document -}}
{{- else if or $p.mode $p.spec $presets -}}
{{- $spec := deepCopy ($p.spec | default dict) -}}
{{- if $p.mode -}}
{{- if and (hasKey $spec "mode") (ne (toString (get $spec "mode")) $p.mode) -}}
{{- fail "policy.mode and policy.spec.mode disagree: set only one" -}}
{{- end -}}
{{- $_ := set $spec "mode" $p.mode -}}
{{- else if not (hasKey $spec "mode") -}}
{{- $_ := set $spec "mode" "warn" -}}
{{- end -}}
{{- if $pairs -}}
{{- $ex := deepCopy (get $spec "exemptions" | default dict) -}}
{{- $sas := list -}}
{{- range (get $ex "serviceAccounts" | default list) -}}
{{- $sas = append $sas . -}}
{{- end -}}
{{- $_ := set $ex "serviceAccounts" (concat $sas $pairs) -}}
{{- $_ := set $spec "exemptions" $ex -}}
{{- end -}}
{{- if $sharing -}}
{{- $builtin := get (fromYaml (.Files.Get "files/policy.yaml")) "spec" -}}
{{- $gpu := get $spec "gpuResources" | default (get $builtin "gpuResources") -}}
{{- $_ := set $spec "gpuResources" (concat $gpu $sharing | uniq) -}}
{{- end -}}
{{- if $kai.enabled -}}
{{- $binder := printf "system:serviceaccount:%s:%s" $kai.namespace $kai.binderServiceAccount -}}
{{- $integrations := deepCopy (get $spec "integrations" | default dict) -}}
{{- $_ := set $integrations "kaiScheduler" (dict "fractions" true "schedulerNames" (list $kai.schedulerName) "binderServiceAccounts" (list $binder)) -}}
{{- $_ := set $spec "integrations" $integrations -}}
{{- end -}}
# gpuguard policy rendered by the Helm chart from its values. Fields left out
# keep the built-in default policy; a list that is set replaces the default list.
# Reference: the gpuguard docs, docs/policy.md.
{{ toYaml (dict "apiVersion" "gpuguard.io/v1alpha1" "kind" "GPUGuardPolicy" "metadata" (dict "name" (include "gpuguard.fullname" .)) "spec" $spec) }}
{{- else -}}
{{- include "gpuguard.defaultPolicyInWarn" . -}}
{{- end -}}
{{- end -}}

{{/*
The built-in default policy with its mode warn: its one spec-level
"mode: enforce" line changed, comments kept.
*/}}
{{- define "gpuguard.defaultPolicyInWarn" -}}
{{- $builtin := .Files.Get "files/policy.yaml" -}}
{{- $warn := replace "\n  mode: enforce\n" "\n  mode: warn\n" $builtin -}}
{{- if eq $warn $builtin -}}
{{- fail "files/policy.yaml has no spec-level 'mode: enforce' line for the chart's warn default" -}}
{{- end -}}
{{- $warn -}}
{{- end -}}

{{/*
Helm's usual fullname of a release of another chart: the release name when it
contains the chart's name, else release-chart, at most 63 characters. Include
with (list RELEASE CHART).
*/}}
{{- define "gpuguard.upstreamFullname" -}}
{{- $release := index . 0 -}}
{{- $chart := index . 1 -}}
{{- if contains $chart $release -}}
{{- $release | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" $release $chart | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/*
The exemptions of the enabled presets, as a YAML list of {namespace, name,
rules}: each preset's namespace paired with its service accounts, listed or
derived from its release name as its upstream chart names them, waiving the
preset's rules.
*/}}
{{- define "gpuguard.presetExemptions" -}}
{{- $ps := .Values.policy.presets -}}
{{- $pairs := list -}}
{{- range $key := list "gpuOperator" "nvidiaDevicePlugin" "nvidiaDRADriver" "dcgmExporter" "nodeExporter" "migManager" -}}
{{- $preset := get $ps $key -}}
{{- if $preset.enabled -}}
{{- $names := $preset.serviceAccounts | default list -}}
{{- if not $names -}}
{{- if eq $key "nvidiaDevicePlugin" -}}
{{- $names = list (printf "%s-service-account" (include "gpuguard.upstreamFullname" (list $preset.releaseName "nvidia-device-plugin"))) -}}
{{- /* Without a config (config.map or config.name) the chart runs the device
plugin and the MPS daemon under the namespace's default account: exempted
only when asked. */ -}}
{{- if $preset.exemptDefaultServiceAccount -}}
{{- $names = append $names "default" -}}
{{- end -}}
{{- else if eq $key "nvidiaDRADriver" -}}
{{- $sa := printf "%s-service-account" (include "gpuguard.upstreamFullname" (list $preset.releaseName $preset.chartName)) -}}
{{- $names = list (printf "%s-kubeletplugin" $sa) (printf "%s-controller" $sa) "compute-domain-daemon-service-account" -}}
{{- else if eq $key "dcgmExporter" -}}
{{- $names = list (include "gpuguard.upstreamFullname" (list $preset.releaseName "dcgm-exporter")) -}}
{{- else if eq $key "nodeExporter" -}}
{{- $names = list (include "gpuguard.upstreamFullname" (list $preset.releaseName "prometheus-node-exporter")) -}}
{{- end -}}
{{- end -}}
{{- if eq $key "gpuOperator" -}}
{{- $names = concat $names (include "gpuguard.nvidiaDriverAccounts" $preset | fromYamlArray) -}}
{{- end -}}
{{- if not $names -}}
{{- fail (printf "policy.presets.%s: no service account to exempt; set serviceAccounts" $key) -}}
{{- end -}}
{{- if not $preset.rules -}}
{{- fail (printf "policy.presets.%s.rules: name the rules to waive (gpuguard rules lists them)" $key) -}}
{{- end -}}
{{- range $names -}}
{{- $pairs = append $pairs (dict "namespace" $preset.namespace "name" . "rules" $preset.rules) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toYaml $pairs -}}
{{- end -}}

{{/*
The service accounts of the driver DaemonSets the GPU Operator creates for its
NVIDIADriver resources: one per resource, driver type and node OS,
nvidia-TYPE-driver-NAME-OSTAG (nvidia-vgpu-manager-NAME-OSTAG for vgpu-host-manager),
as the operator's getDriverName builds them. Include with the gpuOperator preset.
*/}}
{{- define "gpuguard.nvidiaDriverAccounts" -}}
{{- $out := list -}}
{{- range $name := .nvidiaDrivers.names | default list -}}
{{- range $type := $.nvidiaDrivers.driverTypes -}}
{{- range $os := $.nvidiaDrivers.osTags -}}
{{- if eq $type "vgpu-host-manager" -}}
{{- $out = append $out (printf "nvidia-vgpu-manager-%s-%s" $name $os | trunc 253) -}}
{{- else -}}
{{- $out = append $out (printf "nvidia-%s-driver-%s-%s" $type $name $os | trunc 253) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* The policy as data, for decisions the chart takes from it. */}}
{{- define "gpuguard.policySpec" -}}
{{- $doc := fromYaml (include "gpuguard.policyDocument" .) -}}
{{- if hasKey $doc "Error" -}}
{{- fail (printf "policy.document is not valid YAML: %s" (get $doc "Error")) -}}
{{- end -}}
{{- toYaml (get $doc "spec" | default dict) -}}
{{- end -}}

{{/*
KAI's fractions, however the policy turns them on (the preset, policy.spec,
policy.document), need the KAI ConfigMap guard, which the webhook applies with
the backstop, or alone where the API server serves ValidatingAdmissionPolicy
but not MutatingAdmissionPolicy (Kubernetes 1.30 to 1.35): fail unless one of
them is rendered, not merely enabled. The webhook refuses such a policy
without it too.
*/}}
{{- define "gpuguard.requireKAIGuard" -}}
{{- if and (eq (include "gpuguard.kaiFractions" .) "true") (ne (include "gpuguard.backstop" .) "true") (ne (include "gpuguard.kaiGuardOnly" .) "true") -}}
{{- fail "KAI fractions (policy.presets.kaiScheduler, or integrations.kaiScheduler.fractions in the policy) need the KAI ConfigMap guard in force: backstop.enabled=true on Kubernetes 1.30 or later (the guard alone before 1.36, the whole backstop from then), which keeps tenants from writing the ConfigMaps KAI's fractions read NVIDIA_VISIBLE_DEVICES from" -}}
{{- end -}}
{{- end -}}

{{/* "true" when the policy turns KAI's fractions on, however it does. */}}
{{- define "gpuguard.kaiFractions" -}}
{{- $spec := fromYaml (include "gpuguard.policySpec" .) -}}
{{- $kai := get (get $spec "integrations" | default dict) "kaiScheduler" | default dict -}}
{{- ternary "true" "false" (eq (toString (get $kai "fractions")) "true") -}}
{{- end -}}

{{/*
"true" where the webhook applies the KAI ConfigMap guard alone: KAI's
fractions on, backstop.enabled, and an API server that serves
ValidatingAdmissionPolicy but not MutatingAdmissionPolicy.
*/}}
{{- define "gpuguard.kaiGuardOnly" -}}
{{- and .Values.backstop.enabled (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy") (not (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy")) (eq (include "gpuguard.kaiFractions" .) "true") -}}
{{- end -}}

{{/* The policy's mode: enforce unless set. */}}
{{- define "gpuguard.policyMode" -}}
{{- $spec := fromYaml (include "gpuguard.policySpec" .) -}}
{{- get $spec "mode" | default "enforce" -}}
{{- end -}}

{{/* "true" when the webhook may get ConfigMaps in any namespace (envFrom inspection). */}}
{{- define "gpuguard.configMapReads" -}}
{{- $v := .Values.rbac.configMapReads -}}
{{- if eq (toString $v) "auto" -}}
{{- if not .Values.policy.create -}}
true
{{- else -}}
{{- $spec := fromYaml (include "gpuguard.policySpec" .) -}}
{{- $env := get $spec "env" | default dict -}}
{{- $mode := get $env "unprefixedEnvFromOnGPU" | default "inspect" -}}
{{- ternary "true" "false" (eq $mode "inspect") -}}
{{- end -}}
{{- else -}}
{{- ternary "true" "false" (eq (toString $v) "true") -}}
{{- end -}}
{{- end -}}

{{/* Namespaces the webhooks never see. */}}
{{- define "gpuguard.excludedNamespaces" -}}
{{- $ns := list "kube-system" "kube-node-lease" .Release.Namespace -}}
{{- range .Values.admission.systemNamespaces -}}
{{- $ns = append $ns . -}}
{{- end -}}
{{- toYaml (uniq $ns) -}}
{{- end -}}

{{/* Client config of a webhook: include with (dict "ctx" $ "path" "/mutate"). */}}
{{- define "gpuguard.clientConfig" -}}
service:
  name: {{ include "gpuguard.webhookName" .ctx }}
  namespace: {{ .ctx.Release.Namespace }}
  path: {{ .path }}
  port: {{ .ctx.Values.webhook.service.port }}
{{- if eq .ctx.Values.certificates.mode "secret" }}
caBundle: {{ required "certificates.existingSecret.caBundle is required with certificates.mode=secret" .ctx.Values.certificates.existingSecret.caBundle }}
{{- end }}
{{- end -}}

{{/* Common parts of every webhook entry. */}}
{{- define "gpuguard.webhookCommon" -}}
admissionReviewVersions: ["v1"]
sideEffects: None
matchPolicy: Equivalent
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values:
        {{- include "gpuguard.excludedNamespaces" . | nindent 8 }}
{{- end -}}

{{/* Whether the CEL backstop is on: asked for, and served by the API server. */}}
{{- define "gpuguard.backstop" -}}
{{- and .Values.backstop.enabled (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy") (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy") -}}
{{- end -}}

{{/* Name of the CEL backstop's policies and bindings. */}}
{{- define "gpuguard.backstopName" -}}{{ include "gpuguard.fullname" . }}-backstop{{- end -}}

{{/* Failure policy of the pods' validating webhook. */}}
{{- define "gpuguard.podsFailurePolicy" -}}
{{- if ne (include "gpuguard.policyMode" .) "enforce" -}}
{{- /* warn and audit deny nothing: an outage must not block pods either,
whatever the Kubernetes version or the backstop. */ -}}
Ignore
{{- else -}}
{{- if and (eq .Values.webhook.failurePolicy "Ignore") (ne (include "gpuguard.backstop" .) "true") -}}
{{- fail "webhook.failurePolicy=Ignore needs the CEL backstop (backstop.enabled=true on Kubernetes 1.36 or later) in enforce mode: without it a gpuguard outage enforces nothing" -}}
{{- end -}}
{{- .Values.webhook.failurePolicy -}}
{{- end -}}
{{- end -}}

{{/*
imagePullSecrets of every pod of the chart: names of Secrets in the release
namespace, given as strings or as {name: ...} as other charts take them.
*/}}
{{- define "gpuguard.imagePullSecrets" -}}
{{- range . }}
- name: {{ if kindIs "map" . }}{{ required "imagePullSecrets: an entry needs a name" .name }}{{ else }}{{ . }}{{ end }}
{{- end }}
{{- end -}}

{{- /* How long the agents' coverage Leases last: wellknown.CoverageLeaseSeconds,
which the agent writes and the webhook caps (a chart test keeps them equal). */ -}}
{{- define "gpuguard.coverageLeaseSeconds" -}}60{{- end -}}

{{/*
The platform profiles (values: platform; docs/platforms.md): what each
platform's default GPU nodes look like and what its control plane needs.
- nodeTerms: node selector terms for the platform's own GPU labels, ORed
  with agent.gpuNodeLabels;
- tolerations: the taints the platform (or its documented GPU pool setup)
  puts on GPU nodes, added to agent.tolerations;
- runtimeClassName: what agent.runtimeClassName=auto means ("": the NVIDIA
  runtime is the nodes' default, or there is none);
- nvmlLibrary: where NVML is when no NVIDIA runtime injects it;
- criSocket, containerdConfig: the runtime's host paths, where they differ
  from the upstream ones;
- webhookAnnotations: annotations of both webhook configurations;
- scc: the OpenShift SecurityContextConstraints the agent uses;
- priorityClassQuota: the API server limits system-*-critical classes to
  kube-system unless a quota covers them.
*/}}
{{- define "gpuguard.platformProfiles" -}}
generic:
  runtimeClassName: nvidia
eks:
  runtimeClassName: ""
  nodeTerms:
    - [{key: k8s.amazonaws.com/accelerator, operator: Exists}]
    - [{key: eks.amazonaws.com/instance-gpu-manufacturer, operator: In, values: [nvidia]}]
    - [{key: karpenter.k8s.aws/instance-gpu-manufacturer, operator: In, values: [nvidia]}]
  tolerations:
    - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
gke:
  runtimeClassName: ""
  nodeTerms:
    - [{key: cloud.google.com/gke-accelerator, operator: Exists}]
  tolerations:
    - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
  nvmlLibrary: /host/home/kubernetes/bin/nvidia/lib64/libnvidia-ml.so.1
  priorityClassQuota: true
aks:
  runtimeClassName: ""
  nodeTerms:
    - [{key: kubernetes.azure.com/accelerator, operator: Exists}]
  tolerations:
    - {key: sku, operator: Equal, value: gpu, effect: NoSchedule}
    - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
  webhookAnnotations:
    admissions.enforcer/disabled: "true"
openshift:
  runtimeClassName: nvidia
  scc: privileged
k3s:
  runtimeClassName: nvidia
  criSocket: /run/k3s/containerd/containerd.sock
  containerdConfig: /var/lib/rancher/k3s/agent/etc/containerd/config.toml
rke2:
  runtimeClassName: nvidia
  criSocket: /run/k3s/containerd/containerd.sock
  containerdConfig: /var/lib/rancher/rke2/agent/etc/containerd/config.toml
{{- end -}}

{{/* The profile of .Values.platform, as YAML. */}}
{{- define "gpuguard.platform" -}}
{{- $name := .Values.platform | default "generic" -}}
{{- $all := include "gpuguard.platformProfiles" . | fromYaml -}}
{{- if not (hasKey $all $name) -}}
{{- fail (printf "platform %q: want one of generic, eks, gke, aks, openshift, k3s, rke2" $name) -}}
{{- end -}}
{{- toYaml (get $all $name) -}}
{{- end -}}

{{/* The agent's RuntimeClass: agent.runtimeClassName, auto meaning the platform's. */}}
{{- define "gpuguard.agentRuntimeClass" -}}
{{- $v := .Values.agent.runtimeClassName -}}
{{- if eq (toString $v) "auto" -}}
{{- get (include "gpuguard.platform" . | fromYaml) "runtimeClassName" -}}
{{- else -}}
{{- $v -}}
{{- end -}}
{{- end -}}

{{/* The agent's tolerations: agent.tolerations, then the platform's not already there. */}}
{{- define "gpuguard.agentTolerations" -}}
{{- $out := list -}}
{{- range .Values.agent.tolerations -}}{{- $out = append $out . -}}{{- end -}}
{{- range (get (include "gpuguard.platform" . | fromYaml) "tolerations" | default list) -}}
{{- if not (has . $out) -}}{{- $out = append $out . -}}{{- end -}}
{{- end -}}
{{- if $out -}}{{- toYaml $out -}}{{- end -}}
{{- end -}}

{{/* The annotations block of both webhook configurations. */}}
{{- define "gpuguard.webhookConfigAnnotations" -}}
{{- $platform := get (include "gpuguard.platform" . | fromYaml) "webhookAnnotations" -}}
{{- if or (eq .Values.certificates.mode "cert-manager") $platform -}}
annotations:
  {{- if eq .Values.certificates.mode "cert-manager" }}
  # cert-manager's CA injector writes the Certificate's CA into caBundle.
  cert-manager.io/inject-ca-from: {{ .Release.Namespace }}/{{ include "gpuguard.certificateName" . }}
  {{- end }}
  {{- with $platform }}
  # The platform's (AKS: its Admissions Enforcer adds no namespaceSelector of
  # its own, which would also show as drift under GitOps).
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}
{{- end -}}

{{/* podSecurityContext as YAML; on OpenShift without a user or group, which
its restricted-v2 SCC picks from the namespace's range. */}}
{{- define "gpuguard.podSecurityContext" -}}
{{- $sc := deepCopy (.Values.podSecurityContext | default dict) -}}
{{- if get (include "gpuguard.platform" . | fromYaml) "scc" -}}
{{- $sc = omit $sc "runAsUser" "runAsGroup" -}}
{{- end -}}
{{- if $sc -}}{{- toYaml $sc -}}{{- end -}}
{{- end -}}
