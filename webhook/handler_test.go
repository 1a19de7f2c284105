package webhook

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/policy"
	"github.com/gpuguard/gpuguard/webhook/policysource"
)

// staticLabels and staticConfigMaps stand in for the API server behind gpuguard's own
// small interfaces; the real informer and reader run in the end-to-end suite.
type staticLabels map[string]map[string]string

func (s staticLabels) NamespaceLabels(_ context.Context, name string) (map[string]string, error) {
	return s[name], nil
}

type staticConfigMaps map[string]map[string]string

func (s staticConfigMaps) ConfigMapData(_ context.Context, namespace, name string) (map[string]string, error) {
	if d, ok := s[namespace+"/"+name]; ok {
		return d, nil
	}
	return nil, policy.ErrConfigMapNotFound
}

func loadedSource(t testing.TB, policyYAML string) *policysource.Source {
	t.Helper()
	s := NewPolicySource(NewMetrics(), logr.Discard())
	data := config.DefaultYAML()
	if policyYAML != "" {
		data = []byte("apiVersion: gpuguard.io/v1alpha1\nkind: GPUGuardPolicy\n" + policyYAML)
	}
	if _, err := s.Load("test", data); err != nil {
		t.Fatal(err)
	}
	return s
}

func handlerFor(t *testing.T, phase policy.Phase, policyYAML string) *Handler {
	return &Handler{
		Phase: phase, Policies: loadedSource(t, policyYAML), Metrics: NewMetrics(), Log: logr.Discard(),
		Namespaces: staticLabels{"relaxed": {"gpuguard.io/mode": "warn"}, "quiet": {"gpuguard.io/mode": "audit"}},
		ConfigMaps: staticConfigMaps{"team-a/gpu-env": {"NVIDIA_VISIBLE_DEVICES": "all"}},
	}
}

func raw(t testing.TB, obj runtime.Object) runtime.RawExtension {
	t.Helper()
	if obj == nil {
		return runtime.RawExtension{}
	}
	data, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return runtime.RawExtension{Raw: data}
}

type review struct {
	kind        string
	group       string
	op          admissionv1.Operation
	subResource string
	namespace   string
	user        string
	obj, old    runtime.Object
}

func (r review) request(t *testing.T) admission.Request {
	ns := r.namespace
	if ns == "" {
		ns = "team-a"
	}
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "uid-1", Kind: metav1.GroupVersionKind{Group: r.group, Version: "v1", Kind: r.kind},
		Namespace: ns, Operation: r.op, SubResource: r.subResource,
		UserInfo: authenticationv1.UserInfo{Username: r.user}, Object: raw(t, r.obj), OldObject: raw(t, r.old),
	}}
}

func container(name string, gpu bool, env ...corev1.EnvVar) corev1.Container {
	c := corev1.Container{Name: name, Image: "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04", Env: env}
	if gpu {
		c.Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}
	}
	return c
}

func pod(containers ...corev1.Container) *corev1.Pod {
	return &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "team-a"}, Spec: corev1.PodSpec{Containers: containers}}
}

var all = corev1.EnvVar{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}
var void = corev1.EnvVar{Name: "NVIDIA_VISIBLE_DEVICES", Value: "void"}

func deployment(p *corev1.Pod) *appsv1.Deployment {
	return &appsv1.Deployment{TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: "d", Namespace: "team-a"},
		Spec:       appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{Spec: p.Spec}}}
}

func binding(annotations map[string]string) *corev1.Binding {
	return &corev1.Binding{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Binding"},
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "team-a", Annotations: annotations},
		Target:     corev1.ObjectReference{Kind: "Node", Name: "gpu-node-1"}}
}

func TestHandler(t *testing.T) {
	leak := pod(container("app", false, all))
	plain := pod(container("app", false))
	gpu := pod(container("train", true))
	mirror := pod(container("app", false))
	mirror.Annotations = map[string]string{policy.MirrorPodAnnotation: "x"}
	running := pod(container("app", false, void))
	debugged := running.DeepCopy()
	debugged.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debug", Image: "busybox"}}}
	deleting := deployment(leak)
	now := metav1.Now()
	deleting.DeletionTimestamp = &now
	scaled := deployment(leak)
	scaled.Spec.Replicas = new(int32)
	envFrom := pod(container("train", true))
	envFrom.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "gpu-env"}}}}
	exemptPolicy := "spec:\n  exemptions:\n    serviceAccounts: [{namespace: gpu-operator, name: nvidia-device-plugin}]\n    usernames: [system:admin]\n"
	operatorPod := leak.DeepCopy()
	operatorPod.Namespace, operatorPod.Spec.ServiceAccountName = "gpu-operator", "nvidia-device-plugin"
	annotated := running.DeepCopy()
	annotated.Annotations = map[string]string{"cdi.k8s.io/x": "nvidia.com/gpu=all"}

	for _, tc := range []struct {
		name    string
		phase   policy.Phase
		policy  string
		review  review
		allowed bool
		code    int32  // for denials and errors
		message string // in the status message
		patch   string // first patch op, "op path"
		warning string
		audit   string // an audit annotation key
	}{
		{name: "leak denied with field, rule and fix", phase: policy.Validating, review: review{kind: "Pod", op: "CREATE", obj: leak},
			code: http.StatusForbidden, message: `spec.containers[0].env[0] (container "app") [device-env]: sets NVIDIA_VISIBLE_DEVICES="all" without a GPU limit; remove it or add a GPU limit`},
		{name: "leak denied early by mutate", phase: policy.Mutating, review: review{kind: "Pod", op: "CREATE", obj: leak}, code: http.StatusForbidden, message: "[device-env]"},
		{name: "plain pod gets void", phase: policy.Mutating, review: review{kind: "Pod", op: "CREATE", obj: plain}, allowed: true, patch: "add /spec/containers/0/env"},
		{name: "final state without mutation", phase: policy.Validating, review: review{kind: "Pod", op: "CREATE", obj: plain}, code: http.StatusForbidden, message: "[final-state]"},
		{name: "GPU pod untouched", phase: policy.Mutating, review: review{kind: "Pod", op: "CREATE", obj: gpu}, allowed: true},
		{name: "mirror pod never mutated", phase: policy.Mutating, review: review{kind: "Pod", op: "CREATE", obj: mirror}, allowed: true},
		{name: "mirror pod warned", phase: policy.Validating, review: review{kind: "Pod", op: "CREATE", obj: mirror}, allowed: true, warning: "final-state"},
		{name: "warn namespace tightens audit", phase: policy.Validating, policy: "spec:\n  mode: audit\n", review: review{kind: "Pod", op: "CREATE", namespace: "relaxed", obj: leak}, allowed: true, warning: "gpuguard device-env"},
		{name: "audit label cannot relax enforce", phase: policy.Validating, review: review{kind: "Pod", op: "CREATE", namespace: "quiet", obj: leak}, code: http.StatusForbidden, message: "[device-env]"},
		{name: "audit namespace when allowed", phase: policy.Validating, policy: "spec:\n  namespaceModeOverride: Any\n", review: review{kind: "Pod", op: "CREATE", namespace: "quiet", obj: leak}, allowed: true, audit: "device-env"},
		{name: "exempt service account", phase: policy.Validating, policy: exemptPolicy, review: review{kind: "Pod", op: "CREATE", namespace: "gpu-operator", obj: operatorPod}, allowed: true, audit: "exempt"},
		{name: "exempt user", phase: policy.Mutating, policy: exemptPolicy, review: review{kind: "Pod", op: "CREATE", user: "system:admin", obj: leak}, allowed: true, audit: "exempt"},
		{name: "ephemeral container gets void", phase: policy.Mutating, review: review{kind: "Pod", op: "UPDATE", subResource: "ephemeralcontainers", obj: debugged, old: running}, allowed: true, patch: "add /spec/ephemeralContainers/0/env"},
		{name: "ephemeral container without void", phase: policy.Validating, review: review{kind: "Pod", op: "UPDATE", subResource: "ephemeralcontainers", obj: debugged, old: running}, code: http.StatusForbidden, message: "[final-state]"},
		{name: "annotation added on update", phase: policy.Validating, review: review{kind: "Pod", op: "UPDATE", obj: annotated, old: running}, code: http.StatusForbidden, message: "[device-annotation]"},
		{name: "annotation kept on update", phase: policy.Validating, review: review{kind: "Pod", op: "UPDATE", obj: annotated, old: annotated}, allowed: true},
		{name: "annotation added through status", phase: policy.Validating, review: review{kind: "Pod", op: "UPDATE", subResource: "status", obj: annotated, old: running}, code: http.StatusForbidden, message: "[device-annotation]"},
		{name: "status report, annotations kept", phase: policy.Validating, review: review{kind: "Pod", op: "UPDATE", subResource: "status", obj: annotated, old: annotated}, allowed: true},
		{name: "binding with a device annotation", phase: policy.Validating, review: review{kind: "Binding", op: "CREATE", subResource: "binding", obj: binding(map[string]string{"cdi.k8s.io/x": "nvidia.com/gpu=all"})}, code: http.StatusForbidden, message: "metadata.annotations[cdi.k8s.io/x] [device-annotation]"},
		{name: "scheduler binding", phase: policy.Validating, review: review{kind: "Binding", op: "CREATE", subResource: "binding", obj: binding(nil)}, allowed: true},
		{name: "deployment denied", phase: policy.Validating, review: review{kind: "Deployment", group: "apps", op: "CREATE", obj: deployment(leak)}, code: http.StatusForbidden, message: `spec.template.spec.containers[0].env[0] (container "app") [device-env]`},
		{name: "deployment scaled, template unchanged", phase: policy.Validating, review: review{kind: "Deployment", group: "apps", op: "UPDATE", obj: scaled, old: deployment(leak)}, allowed: true},
		{name: "deployment template changed", phase: policy.Validating, review: review{kind: "Deployment", group: "apps", op: "UPDATE", obj: deployment(leak), old: deployment(plain)}, code: http.StatusForbidden},
		{name: "deployment being deleted", phase: policy.Validating, review: review{kind: "Deployment", group: "apps", op: "UPDATE", obj: deleting, old: deployment(plain)}, allowed: true},
		{name: "envFrom ConfigMap inspected", phase: policy.Validating, review: review{kind: "Pod", op: "CREATE", obj: envFrom}, code: http.StatusForbidden, message: `through ConfigMap "gpu-env"`},
		{name: "unknown kind allowed", phase: policy.Validating, review: review{kind: "Service", op: "CREATE", obj: &corev1.Service{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"}}}, allowed: true},
		{name: "delete allowed", phase: policy.Validating, review: review{kind: "Pod", op: "DELETE", old: leak}, allowed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := handlerFor(t, tc.phase, tc.policy)
			resp := h.Handle(context.Background(), tc.review.request(t))
			if resp.Allowed != tc.allowed {
				t.Fatalf("allowed = %v, want %v: %+v", resp.Allowed, tc.allowed, resp.Result)
			}
			if !tc.allowed && (resp.Result == nil || resp.Result.Code != tc.code || !strings.Contains(resp.Result.Message, tc.message)) {
				t.Errorf("denial %+v, want code %d and message containing %q", resp.Result, tc.code, tc.message)
			}
			switch {
			case tc.patch == "" && len(resp.Patches) > 0:
				t.Errorf("unexpected patch %+v", resp.Patches)
			case tc.patch != "" && (len(resp.Patches) == 0 || resp.Patches[0].Operation+" "+resp.Patches[0].Path != tc.patch):
				t.Errorf("patch %+v, want first op %q", resp.Patches, tc.patch)
			}
			if tc.warning != "" && !strings.Contains(strings.Join(resp.Warnings, "\n"), tc.warning) {
				t.Errorf("warnings %q lack %q", resp.Warnings, tc.warning)
			}
			for _, w := range resp.Warnings {
				if len(w) > 120 {
					t.Errorf("warning over 120 characters: %q", w)
				}
			}
			if _, ok := resp.AuditAnnotations[tc.audit]; tc.audit != "" && !ok {
				t.Errorf("audit annotations %v lack %q", resp.AuditAnnotations, tc.audit)
			}
		})
	}
}

func TestHandlerBadInput(t *testing.T) {
	h := handlerFor(t, policy.Validating, "")
	req := review{kind: "Pod", op: "CREATE"}.request(t)
	req.Object = runtime.RawExtension{Raw: []byte(`{"apiVersion":"v1","kind":"Pod","spec":{"containers":"oops"}}`)}
	resp := h.Handle(context.Background(), req)
	if resp.Allowed || resp.Result.Code != http.StatusBadRequest || !strings.Contains(resp.Result.Message, "decoding Pod") {
		t.Errorf("a malformed pod must get a clean 400 naming it, got %+v", resp.Result)
	}

	empty := &Handler{Phase: policy.Validating, Policies: NewPolicySource(NewMetrics(), logr.Discard()), Metrics: NewMetrics(), Log: logr.Discard()}
	resp = empty.Handle(context.Background(), review{kind: "Pod", op: "CREATE", obj: pod(container("a", false))}.request(t))
	if resp.Allowed || resp.Result.Code != http.StatusServiceUnavailable {
		t.Errorf("without a policy the webhook must fail the request (failurePolicy decides), got %+v", resp.Result)
	}
}

// TestDecisionsByNamespace: denials (in the phase that makes them) and
// warnings (where the final object is judged) count once per request in
// their namespace, for "which tenant is denied?"; past the bound, in
// namespace _other, so namespaces created per job cannot grow the series
// without end.
func TestDecisionsByNamespace(t *testing.T) {
	m := NewMetrics()
	m.ByNamespace = newNamespaceCounter(m.ByNamespace.vec, 2)
	leak := pod(container("app", false, all))
	send := func(phase policy.Phase, ns, policyYAML string) {
		h := handlerFor(t, phase, policyYAML)
		h.Metrics = m
		h.Handle(context.Background(), review{kind: "Pod", op: "CREATE", namespace: ns, obj: leak}.request(t))
	}
	send(policy.Mutating, "team-a", "")                        // denied at mutation
	send(policy.Validating, "team-b", "spec:\n  mode: warn\n") // warned at validation
	send(policy.Mutating, "team-b", "spec:\n  mode: warn\n")   // no count: mutation does not warn-count
	send(policy.Mutating, "team-c", "")                        // past the bound
	for _, c := range []struct {
		ns, decision string
		want         float64
	}{{"team-a", "deny", 1}, {"team-b", "warn", 1}, {"team-c", "deny", 0}, {otherNamespaces, "deny", 1}} {
		if got := testutil.ToFloat64(m.ByNamespace.vec.WithLabelValues(c.ns, c.decision)); got != c.want {
			t.Errorf("%s %s: %v, want %v", c.ns, c.decision, got, c.want)
		}
	}
}
