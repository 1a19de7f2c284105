{{/*
The webhook's Deployment, for a role (include with (dict "ctx" $ "role" ROLE)):
serve, the pods the API server calls, which write nothing of admission
configuration; control, the controller that keeps the certificate, the CEL
backstop, the pre-filter and the background audit; all, both in one
(webhook.controller.enabled=false).
*/}}
{{- define "gpuguard.webhookDeployment" -}}
{{- $ctx := .ctx -}}
{{- $role := .role -}}
{{- $w := $ctx.Values.webhook -}}
{{- $mode := $ctx.Values.certificates.mode -}}
{{- $serves := ne $role "control" -}}
{{- $applies := ne $role "serve" -}}
{{- /* webhook.hostNetwork: the serving pods on their nodes' network, on ports of their own. */ -}}
{{- $hostNet := and $serves $w.hostNetwork -}}
{{- $port := ternary $w.hostNetworkPorts.https $w.port $hostNet -}}
{{- $metricsPort := ternary $w.hostNetworkPorts.metrics $w.metricsPort $hostNet -}}
{{- $probePort := ternary $w.hostNetworkPorts.probes $w.probePort $hostNet -}}
{{- $name := ternary (include "gpuguard.controllerName" $ctx) (include "gpuguard.webhookName" $ctx) (eq $role "control") -}}
{{- $component := ternary "controller" "webhook" (eq $role "control") -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $name }}
  namespace: {{ $ctx.Release.Namespace }}
  labels:
    {{- include "gpuguard.componentLabels" (dict "ctx" $ctx "component" $component) | nindent 4 }}
spec:
  replicas: {{ ternary $w.controller.replicas $w.replicas (eq $role "control") }}
  revisionHistoryLimit: 5
  strategy:
    type: RollingUpdate
    rollingUpdate:
      # Never drop below the desired count: the validating webhook fails closed.
      maxUnavailable: 0
      maxSurge: 1
  selector:
    matchLabels:
      {{- include "gpuguard.selectorLabels" (dict "ctx" $ctx "component" $component) | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "gpuguard.selectorLabels" (dict "ctx" $ctx "component" $component) | nindent 8 }}
        {{- with $w.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- if or $applies $w.podAnnotations }}
      annotations:
        {{- if $applies }}
        # A change of the webhook configurations rolls the pods that register them.
        checksum/webhook-configurations: {{ include "gpuguard.webhookConfigurations" $ctx | sha256sum }}
        {{- end }}
        {{- with $w.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- end }}
    spec:
      serviceAccountName: {{ $name }}
      {{- if $hostNet }}
      # webhook.hostNetwork: the control plane reaches the node's address (a
      # custom CNI whose pod IPs it cannot route to).
      hostNetwork: true
      dnsPolicy: ClusterFirstWithHostNet
      {{- end }}
      {{- with $w.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      {{- with $ctx.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- include "gpuguard.imagePullSecrets" . | nindent 8 }}
      {{- end }}
      {{- with include "gpuguard.podSecurityContext" $ctx }}
      securityContext:
        {{- . | nindent 8 }}
      {{- end }}
      containers:
        - name: {{ $component }}
          image: {{ include "gpuguard.image" (dict "image" $w.image "ctx" $ctx) }}
          imagePullPolicy: {{ $w.image.pullPolicy }}
          args:
            - webhook
            {{- if ne $role "all" }}
            - --role={{ $role }}
            {{- end }}
            {{- if $serves }}
            - --port={{ $port }}
            {{- end }}
            - --health-probe-bind-address=:{{ $probePort }}
            - --metrics-bind-address=:{{ $metricsPort }}
            - --policy-configmap={{ $ctx.Release.Namespace }}/{{ include "gpuguard.policyConfigMap" $ctx }}
            - --configmap-cache-ttl={{ $w.configMapCacheTTL }}
            {{- if $serves }}
            - --shutdown-delay={{ $w.shutdownDelay }}
            {{- end }}
            - --policy-fallback={{ $w.policyFallback }}
            {{- if $serves }}
            - --max-inflight-reviews={{ int $w.limits.maxInflightReviews }}
            - --max-inflight-review-bytes={{ int64 $w.limits.maxInflightReviewBytes }}
            - --max-connections={{ int $w.limits.maxConnections }}
            - --max-header-bytes={{ int $w.limits.maxHeaderBytes }}
            - --read-header-timeout={{ $w.limits.readHeaderTimeout }}
            {{- end }}
            - --cert-dir=/certs
            - --service-name={{ include "gpuguard.webhookName" $ctx }}
            {{- if $applies }}
            {{- range (include "gpuguard.excludedNamespaces" $ctx | fromYamlArray) }}
            - --unguarded-namespace={{ . }}
            {{- end }}
            {{- end }}
            - --log-format={{ $w.logFormat }}
            - --log-level={{ $w.logLevel }}
            {{- if eq $mode "self-managed" }}
            - --cert-secret={{ $ctx.Release.Namespace }}/{{ include "gpuguard.tlsSecret" $ctx }}
            {{- if $serves }}
            - --write-cert-dir
            {{- end }}
            {{- end }}
            {{- if $applies }}
            - --mutating-webhook-configuration={{ include "gpuguard.webhookConfigName" $ctx }}
            - --validating-webhook-configuration={{ include "gpuguard.webhookConfigName" $ctx }}
            # Registered here once a replica is ready: until then nothing calls
            # the webhook, so an install that never comes up blocks nothing.
            - --webhook-configurations-file=/etc/gpuguard/webhook-configurations/configurations.yaml
            - --webhook-configurations-owner={{ $name }}
            {{- end }}
            {{- if or (eq (include "gpuguard.backstop" $ctx) "true") (eq (include "gpuguard.kaiGuardOnly" $ctx) "true") }}
            - --cel-backstop
            {{- if eq (include "gpuguard.kaiGuardOnly" $ctx) "true" }}
            - --cel-backstop-kai-guard-only
            {{- end }}
            - --cel-backstop-name={{ include "gpuguard.backstopName" $ctx }}
            - --cel-backstop-owner={{ include "gpuguard.backstopOwner" $ctx }}
            {{- range (include "gpuguard.excludedNamespaces" $ctx | fromYamlArray) }}
            - --cel-backstop-exclude-namespace={{ . }}
            {{- end }}
            {{- end }}
            {{- if and $applies $ctx.Values.admission.prefilter }}
            - --prefilter-webhook=mutate.pods.gpuguard.io
            - --prefilter-webhook=validate.pods.gpuguard.io
            {{- end }}
            {{- if ne $ctx.Values.admission.injectVoid "always" }}
            - --inject-void={{ $ctx.Values.admission.injectVoid }}
            {{- end }}
            {{- if eq $ctx.Values.admission.injectVoid "auto" }}
            {{- if not (and $ctx.Values.agent.enabled (or $ctx.Values.agent.publishNodeLabels $ctx.Values.agent.enforce)) }}
            {{- fail "admission.injectVoid=auto follows the agents' node labels or their node enforcers: set agent.enabled=true and agent.publishNodeLabels=true or agent.enforce=true" }}
            {{- end }}
            {{- range $ctx.Values.agent.gpuNodeLabels }}
            - --gpu-node-label={{ . }}=true
            {{- end }}
            {{- range $ctx.Values.admission.gpuDRADrivers }}
            - --gpu-dra-driver={{ . }}
            {{- end }}
            {{- /* The agents' Leases: the node enforcers' cover a node, the
            agents' own keep the hardened mark fresh. */}}
            - --enforcer-lease-namespace={{ $ctx.Release.Namespace }}
            {{- end }}
            {{- if and $applies $ctx.Values.audit.enabled }}
            - --audit-interval={{ $ctx.Values.audit.interval }}
            {{- range (include "gpuguard.excludedNamespaces" $ctx | fromYamlArray) }}
            - --audit-exclude-namespace={{ . }}
            {{- end }}
            {{- if $ctx.Values.reports.enabled }}
            - --audit-reports
            {{- end }}
            {{- end }}
            {{- range $w.extraArgs }}
            - {{ . | quote }}
            {{- end }}
          env:
            # The Go runtime keeps its heap under 90% of this (GOMEMLIMIT wins).
            - name: GPUGUARD_MEMORY_LIMIT
              valueFrom:
                resourceFieldRef:
                  resource: limits.memory
          ports:
            {{- if $serves }}
            - name: https
              containerPort: {{ $port }}
              protocol: TCP
            {{- end }}
            - name: metrics
              containerPort: {{ $metricsPort }}
              protocol: TCP
            - name: probes
              containerPort: {{ $probePort }}
              protocol: TCP
          livenessProbe:
            httpGet:
              path: /healthz
              port: probes
            periodSeconds: 10
            timeoutSeconds: 2
            failureThreshold: 3
          readinessProbe:
            # Ready once the policy is loaded and, where it serves reviews, the
            # namespace cache synced and the TLS server answers.
            httpGet:
              path: /readyz
              port: probes
            periodSeconds: 5
            timeoutSeconds: 2
            failureThreshold: 3
          {{- with (ternary $w.controller.resources $w.resources (eq $role "control")) }}
          resources:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- with $ctx.Values.containerSecurityContext }}
          securityContext:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          volumeMounts:
            - name: certs
              mountPath: /certs
              readOnly: {{ ne $mode "self-managed" }}
            - name: tmp
              mountPath: /tmp
            {{- if $applies }}
            - name: webhook-configurations
              mountPath: /etc/gpuguard/webhook-configurations
              readOnly: true
            {{- end }}
      volumes:
        # tls.crt and tls.key, reloaded by the webhook when they change.
        {{- if eq $mode "self-managed" }}
        # The webhook writes them from its Secret itself (--write-cert-dir): a
        # mounted Secret would only catch up when the kubelet next syncs it, a
        # minute or more after a fresh install.
        - name: certs
          emptyDir:
            medium: Memory
            sizeLimit: 1Mi
        {{- else }}
        - name: certs
          secret:
            secretName: {{ include "gpuguard.tlsSecret" $ctx }}
        {{- end }}
        - name: tmp
          emptyDir:
            sizeLimit: 16Mi
        {{- if $applies }}
        - name: webhook-configurations
          configMap:
            name: {{ include "gpuguard.webhookConfigurationsConfigMap" $ctx }}
        {{- end }}
      topologySpreadConstraints:
        {{- if $w.topologySpreadConstraints }}
        {{- toYaml $w.topologySpreadConstraints | nindent 8 }}
        {{- else }}
        - maxSkew: 1
          topologyKey: kubernetes.io/hostname
          whenUnsatisfiable: ScheduleAnyway
          labelSelector:
            matchLabels:
              {{- include "gpuguard.selectorLabels" (dict "ctx" $ctx "component" $component) | nindent 14 }}
        - maxSkew: 1
          topologyKey: topology.kubernetes.io/zone
          whenUnsatisfiable: ScheduleAnyway
          labelSelector:
            matchLabels:
              {{- include "gpuguard.selectorLabels" (dict "ctx" $ctx "component" $component) | nindent 14 }}
        {{- end }}
      {{- with $w.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $w.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $w.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end -}}
