package webhook

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/gpuguard/gpuguard/internal/manifest"
	"github.com/gpuguard/gpuguard/policy"
	"github.com/gpuguard/gpuguard/webhook/policysource"
)

// EngineSource gives the engine of the policy in force, or nil before one is loaded.
type EngineSource interface {
	Engine() *policy.Engine
}

// NamespaceLabels gives the labels of a namespace, from a cache.
type NamespaceLabels interface {
	NamespaceLabels(ctx context.Context, name string) (map[string]string, error)
}

// Handler serves one admission phase. It decodes the request, hands it to the
// engine of the policy in force, and turns the result into a response.
type Handler struct {
	Phase    policy.Phase
	Policies EngineSource
	// Namespaces and ConfigMaps may be nil when no API server is available.
	Namespaces NamespaceLabels
	ConfigMaps policy.ConfigMapSource
	// Nodes serves what a node advertises; nil when no API server is
	// available.
	Nodes   policy.NodeSource
	Metrics *Metrics
	Log     logr.Logger
}

var _ admission.Handler = &Handler{}

// Handle implements admission.Handler.
func (h *Handler) Handle(ctx context.Context, req admission.Request) admission.Response {
	start := time.Now()
	kind := req.Kind.Kind
	engine := h.Policies.Engine()
	if engine == nil {
		h.count(req, "error", "")
		return admission.Errored(http.StatusServiceUnavailable, policysource.ErrNoPolicy)
	}
	preq, err := h.policyRequest(ctx, req)
	if err != nil {
		h.count(req, "error", "")
		return admission.Errored(http.StatusBadRequest, err)
	}
	if preq.Object == nil {
		h.count(req, "allow", "")
		return admission.Allowed("")
	}
	result := engine.Evaluate(ctx, preq)
	h.Metrics.Evaluation.WithLabelValues(string(h.Phase)).Observe(time.Since(start).Seconds())
	decision := result.Decision()
	h.countResult(req, decision, result)
	// Every denial and every patch is logged; warnings once, where the
	// client gets them (the validating phase gives advice).
	if !result.Allowed || len(result.Patch) > 0 || (len(result.Warnings) > 0 && h.Phase == policy.Validating) {
		h.Log.Info("admission "+string(decision), "uid", req.UID, "phase", h.Phase, "namespace", req.Namespace,
			"name", objectName(req, preq.Object), "kind", kind, "operation", req.Operation, "rules", rulesOf(result),
			"findings", len(result.Violations)+result.OmittedViolations, "user", req.UserInfo.Username,
			"mode", result.Mode, "dryRun", req.DryRun != nil && *req.DryRun)
	}
	return responseFor(result, kind)
}

// policyRequest translates an admission request into the engine's input. Object is
// nil for a kind the engine does not judge.
func (h *Handler) policyRequest(ctx context.Context, req admission.Request) (*policy.Request, error) {
	gvk := schema.GroupVersionKind(req.Kind)
	obj, err := decode(gvk, req.Object)
	if err != nil || obj == nil {
		return &policy.Request{}, err
	}
	old, err := decode(gvk, req.OldObject)
	if err != nil {
		return nil, fmt.Errorf("oldObject: %w", err)
	}
	labels := map[string]string(nil)
	if h.Namespaces != nil && req.Namespace != "" {
		if labels, err = h.Namespaces.NamespaceLabels(ctx, req.Namespace); err != nil {
			h.Log.Error(err, "namespace labels unknown; the policy's mode applies", "namespace", req.Namespace)
		}
	}
	return &policy.Request{
		Operation:       req.Operation,
		SubResource:     req.SubResource,
		Namespace:       req.Namespace,
		Object:          obj,
		OldObject:       old,
		UserInfo:        req.UserInfo,
		NamespaceLabels: labels,
		Phase:           h.Phase,
		ConfigMaps:      h.ConfigMaps,
		Nodes:           h.Nodes,
	}, nil
}

func decode(gvk schema.GroupVersionKind, raw runtime.RawExtension) (runtime.Object, error) {
	if len(raw.Raw) == 0 {
		return nil, nil
	}
	obj, err := manifest.DecodeAs(gvk, raw.Raw)
	if err != nil {
		return nil, fmt.Errorf("decoding %s: %w", gvk.Kind, err)
	}
	return obj, nil
}

// responseFor turns the engine's result into an admission response: a denial names
// every violation with its field, rule and fix; an allowed response carries the
// engine's own JSON Patch, warnings and audit annotations.
func responseFor(r policy.Result, kind string) admission.Response {
	var resp admission.Response
	if r.Allowed {
		resp = admission.Allowed("")
		resp.Patches = r.Patch
	} else {
		resp = admission.Denied(denialMessage(r, kind))
	}
	resp.Warnings = r.WarningStrings()
	resp.AuditAnnotations = r.AuditAnnotations
	return resp
}

func denialMessage(r policy.Result, kind string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "gpuguard denied this %s (mode %s)", strings.ToLower(kind), r.Mode)
	for _, v := range r.Violations {
		b.WriteString("\n- " + v.String())
	}
	if r.OmittedViolations > 0 {
		fmt.Fprintf(&b, "\n- and %d more violations %v", r.OmittedViolations, r.OmittedRules)
	}
	return b.String()
}

// rulesOf names each rule of the result once, sorted: a pod with thousands
// of offending entries is one log field and one metric increment per rule.
func rulesOf(r policy.Result) []string {
	var rules []string
	for _, rule := range r.Rules() {
		rules = append(rules, string(rule))
	}
	return rules
}

func (h *Handler) count(req admission.Request, decision, rule string) {
	h.Metrics.Decisions.WithLabelValues(string(h.Phase), string(req.Operation), req.Kind.Kind, decision, rule).Inc()
}

func (h *Handler) countResult(req admission.Request, decision policy.Decision, r policy.Result) {
	// A denial ends the request in the phase that makes it; warnings are
	// counted where the final object is judged, so each request counts once.
	if h.Metrics.ByNamespace != nil && (decision == policy.DecisionDeny || (decision == policy.DecisionWarn && h.Phase == policy.Validating)) {
		h.Metrics.ByNamespace.inc(req.Namespace, string(decision))
	}
	rules := rulesOf(r)
	if len(rules) == 0 {
		h.count(req, string(decision), "")
	}
	for _, rule := range rules {
		h.count(req, string(decision), rule)
	}
}

// objectName names the object for logs; a pod created from generateName has no
// name yet.
func objectName(req admission.Request, obj runtime.Object) string {
	if req.Name != "" {
		return req.Name
	}
	if m, err := meta.Accessor(obj); err == nil && m.GetName() != "" {
		return m.GetName()
	}
	return "(generated)"
}
