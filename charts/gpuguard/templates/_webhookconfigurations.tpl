{{/*
gpuguard's two webhook configurations. They are not resources of the release:
the chart renders them into the ConfigMap <fullname>-webhook-configurations,
and the webhook registers them itself, server-side apply, once one of its
replicas is ready (--webhook-configurations-file). An install whose webhook
never comes up (an image that cannot be pulled) so guards nothing and blocks
nothing, and a failed install leaves no configuration behind; helm uninstall
deletes the webhook's ClusterRole, which owns them, and the garbage collector
takes them.
*/}}
{{- define "gpuguard.webhookConfigurations" -}}
{{- $t := .Values.admission.timeoutSeconds -}}
# The mutating phase injects NVIDIA_VISIBLE_DEVICES=void. It fails open, as the
# Kubernetes good-practice guide advises: the validating phase below checks the
# final state, so a pod the mutating phase missed is still judged.
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: {{ include "gpuguard.webhookConfigName" . }}
  labels:
    {{- include "gpuguard.componentLabels" (dict "ctx" $ "component" "webhook") | nindent 4 }}
  {{- with include "gpuguard.webhookConfigAnnotations" . }}
  {{- . | nindent 2 }}
  {{- end }}
webhooks:
  - name: mutate.pods.gpuguard.io
    clientConfig:
      {{- include "gpuguard.clientConfig" (dict "ctx" $ "path" "/mutate") | nindent 6 }}
    rules:
      - apiGroups: [""]
        apiVersions: ["v1"]
        operations: ["CREATE"]
        resources: ["pods"]
        scope: Namespaced
      - apiGroups: [""]
        apiVersions: ["v1"]
        operations: ["UPDATE"]
        resources: ["pods/ephemeralcontainers"]
        scope: Namespaced
    failurePolicy: Ignore
    reinvocationPolicy: IfNeeded
    timeoutSeconds: {{ $t.mutate }}
    {{- include "gpuguard.webhookCommon" . | nindent 4 }}
---
# The validating phase enforces. Pods fail closed: gpuguard down means pods in
# guarded namespaces are not admitted. Pod controllers fail open: they only get
# early feedback, their pods are judged anyway, and an outage must not block
# their rollouts.
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: {{ include "gpuguard.webhookConfigName" . }}
  labels:
    {{- include "gpuguard.componentLabels" (dict "ctx" $ "component" "webhook") | nindent 4 }}
  {{- with include "gpuguard.webhookConfigAnnotations" . }}
  {{- . | nindent 2 }}
  {{- end }}
webhooks:
  - name: validate.pods.gpuguard.io
    clientConfig:
      {{- include "gpuguard.clientConfig" (dict "ctx" $ "path" "/validate") | nindent 6 }}
    rules:
      - apiGroups: [""]
        apiVersions: ["v1"]
        operations: ["CREATE", "UPDATE"]
        resources: ["pods"]
        scope: Namespaced
      - apiGroups: [""]
        apiVersions: ["v1"]
        operations: ["UPDATE"]
        resources: ["pods/ephemeralcontainers", "pods/status"]
        scope: Namespaced
      # The API server copies a binding's annotations onto the pod, through
      # pods/binding and through the older namespace-level bindings resource.
      - apiGroups: [""]
        apiVersions: ["v1"]
        operations: ["CREATE"]
        resources: ["pods/binding", "bindings"]
        scope: Namespaced
    # pods/status can change annotations (its strategy resets only the spec);
    # only such updates, and bindings that carry annotations, are sent: the
    # kubelet's status reports and the scheduler's bindings never reach gpuguard.
    matchConditions:
      - name: annotations-changed-on-status
        # The same expression as the CEL backstop's (cel.AnnotationsChanged).
        expression: '(has(request.subResource) ? request.subResource : "") != "status" || has(object.metadata.annotations) != has(oldObject.metadata.annotations) || (has(object.metadata.annotations) && object.metadata.annotations != oldObject.metadata.annotations)'
      - name: binding-has-annotations
        expression: 'request.kind.kind != "Binding" || (has(object.metadata.annotations) && size(object.metadata.annotations) > 0)'
    failurePolicy: {{ include "gpuguard.podsFailurePolicy" . }}
    timeoutSeconds: {{ $t.validatePods }}
    {{- include "gpuguard.webhookCommon" . | nindent 4 }}
  - name: validate.controllers.gpuguard.io
    clientConfig:
      {{- include "gpuguard.clientConfig" (dict "ctx" $ "path" "/validate") | nindent 6 }}
    rules:
      - apiGroups: ["apps"]
        apiVersions: ["v1"]
        operations: ["CREATE", "UPDATE"]
        resources: ["deployments", "replicasets", "statefulsets", "daemonsets"]
        scope: Namespaced
      - apiGroups: ["batch"]
        apiVersions: ["v1"]
        operations: ["CREATE", "UPDATE"]
        resources: ["jobs", "cronjobs"]
        scope: Namespaced
      - apiGroups: [""]
        apiVersions: ["v1"]
        operations: ["CREATE", "UPDATE"]
        resources: ["replicationcontrollers", "podtemplates"]
        scope: Namespaced
    failurePolicy: Ignore
    timeoutSeconds: {{ $t.validateControllers }}
    {{- include "gpuguard.webhookCommon" . | nindent 4 }}

{{- end -}}
