package policy

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpuguard/gpuguard/config"
)

// Phase is the admission phase a request is evaluated for.
type Phase string

// Phases. The mutating phase computes the patch; the validating phase judges the
// final object, after every mutating webhook, and adds the final-state rule.
const (
	Mutating   Phase = "mutating"
	Validating Phase = "validating"
)

// MirrorPodAnnotation marks a pod that the kubelet mirrors from a static manifest.
const MirrorPodAnnotation = "kubernetes.io/config.mirror"

// ErrConfigMapNotFound is returned by a ConfigMapSource for a ConfigMap it does not have.
var ErrConfigMapNotFound = errors.New("configmap not found")

// ConfigMapSource gives the data of ConfigMaps named by envFrom, for inspection.
// The webhook reads them through the API; `gpuguard check` takes them from its input.
// Secrets are never asked for.
type ConfigMapSource interface {
	ConfigMapData(ctx context.Context, namespace, name string) (map[string]string, error)
}

// ErrNodeNotFound is returned by a NodeSource for a Node it does not have.
var ErrNodeNotFound = errors.New("node not found")

// NodeSource gives what a Node advertises, for a pod created bound to it.
type NodeSource interface {
	NodeAllocatable(ctx context.Context, name string) (corev1.ResourceList, error)
}

// Request is everything the API server knows about one admission.
type Request struct {
	Operation   admissionv1.Operation
	SubResource string
	// Namespace of the request; when empty, the object's, and else "default".
	Namespace string
	Object    runtime.Object
	OldObject runtime.Object
	UserInfo  authenticationv1.UserInfo
	// NamespaceLabels are the labels of the request's namespace, when known.
	NamespaceLabels map[string]string
	Phase           Phase
	// ConfigMaps serves envFrom inspection; nil means no ConfigMap is known.
	ConfigMaps ConfigMapSource
	// Nodes serves what a node advertises, for pods bound to it at
	// creation; nil means nodes are unknown (offline checks), and bound
	// pods are judged by their requests alone.
	Nodes NodeSource
}

// Violation is one reason to deny.
type Violation struct {
	// Path of the offending field, such as spec.initContainers[1].env[0].
	Path string `json:"path"`
	Rule RuleID `json:"rule"`
	// Container is the container's name, or empty for pod-level rules.
	Container string `json:"container,omitempty"`
	// Message is one line a user can act on.
	Message string `json:"message"`
}

// Result is the engine's decision.
type Result struct {
	Allowed bool `json:"allowed"`
	// Mode is the mode that applied to the request.
	Mode config.Mode `json:"mode"`
	// Exempt names the exemption that let the request through untouched.
	Exempt     string      `json:"exempt,omitempty"`
	Violations []Violation `json:"violations"`
	// OmittedViolations counts the violations beyond the MaxFindings listed
	// findings: the object is denied for them too.
	OmittedViolations int `json:"omittedViolations,omitempty"`
	// OmittedRules are the rules of the omitted violations, sorted.
	OmittedRules []RuleID `json:"omittedRules,omitempty"`
	// Warnings are returned to the client as admission warnings
	// (Warning.String).
	Warnings []Warning `json:"warnings"`
	// AuditAnnotations are recorded in the API server's audit log.
	AuditAnnotations map[string]string `json:"auditAnnotations,omitempty"`
	// Patch is an RFC 6902 patch against the object exactly as given.
	Patch []jsonpatch.Operation `json:"patch"`
	// TemplateVoid names, for a pod controller, the containers its pods will
	// get NVIDIA_VISIBLE_DEVICES=void in (templates are judged, not patched).
	TemplateVoid []string `json:"templateVoid,omitempty"`
}

// Warning is a finding the client is told about without a denial.
type Warning struct {
	Rule RuleID `json:"rule"`
	// Path of the field concerned, where there is one.
	Path    string `json:"path,omitempty"`
	Message string `json:"message"`
}

// Decision classifies a result, the same way for check's verdicts, the
// webhook's metrics and logs, and the audit.
type Decision string

// Decisions, in precedence: a denied object is "deny" whatever else; an
// admitted one with warnings is "warn", since its owner has something to
// act on, even if it was also patched.
const (
	DecisionExempt Decision = "exempt"
	DecisionDeny   Decision = "deny"
	DecisionWarn   Decision = "warn"
	DecisionMutate Decision = "mutate"
	DecisionAllow  Decision = "allow"
)

// Decision classifies the result.
func (r *Result) Decision() Decision {
	switch {
	case r.Exempt != "":
		return DecisionExempt
	case !r.Allowed:
		return DecisionDeny
	case len(r.Warnings) > 0:
		return DecisionWarn
	case len(r.Patch) > 0:
		return DecisionMutate
	}
	return DecisionAllow
}

// WarningStrings are the warnings as admission warnings.
func (r *Result) WarningStrings() []string {
	out := make([]string, len(r.Warnings))
	for i, w := range r.Warnings {
		out[i] = w.String()
	}
	return out
}

// Rules names each rule of the result once, sorted: violations, omitted
// violations and warnings.
func (r *Result) Rules() []RuleID {
	var rules []RuleID
	for _, v := range r.Violations {
		rules = append(rules, v.Rule)
	}
	rules = append(rules, r.OmittedRules...)
	for _, w := range r.Warnings {
		rules = append(rules, w.Rule)
	}
	slices.Sort(rules)
	return slices.Compact(rules)
}

// Engine evaluates requests against one policy. It is safe for concurrent use.
type Engine struct {
	policy *config.Policy

	gpuExact           map[string]bool
	gpuGlobs           []string
	deviceVars         []string
	protected          map[string]*config.ProtectedVariable
	protectedNames     []string // every protected name, device variables included
	runtimeClasses     map[string]bool
	exemptNamespaces   map[string]bool
	exemptUsers        map[string]bool
	waivers            Waivers
	sensitiveHostPaths [][]string // each policy path under every name the host gives it (HostAliases), in the policy's order
	writeProtected     [][]string // the same for writeProtectedHostPaths
	writable           [][]string // the same for writableHostPaths, scoped or not
	runtimeState       [][]string // the same for runtimeStateHostPaths
	readOnlyState      [][]string // the same for readOnlyRuntimeStatePaths
	named              []string   // writableHostPaths and writeProtectedHostPaths under every name, sorted
	// addable are the capabilities added-capabilities lets a container
	// add, in the runtime's form (upper case, without CAP_).
	addable map[string]bool
}

// New compiles a validated policy into an engine.
func New(p *config.Policy) (*Engine, error) {
	if errs := config.Validate(p); len(errs) > 0 {
		return nil, fmt.Errorf("invalid policy: %v", errs.ToAggregate())
	}
	s := &p.Spec
	e := &Engine{
		policy:           p,
		gpuExact:         map[string]bool{},
		protected:        map[string]*config.ProtectedVariable{},
		runtimeClasses:   setOf(s.NVIDIARuntimeClasses),
		exemptNamespaces: setOf(s.Exemptions.Namespaces),
		exemptUsers:      setOf(s.Exemptions.Usernames),
	}
	exact, globs := s.GPUResourcePatterns()
	for _, r := range exact {
		e.gpuExact[r] = true
	}
	e.gpuGlobs = globs
	e.deviceVars = s.DeviceVariables()
	e.protectedNames = s.ProtectedNames()
	for i := range s.Env.ProtectedVariables {
		v := &s.Env.ProtectedVariables[i]
		e.protected[v.Name] = v
	}
	waivers, err := NewWaivers(s)
	if err != nil {
		return nil, fmt.Errorf("invalid policy: %w", err)
	}
	e.waivers = waivers
	e.sensitiveHostPaths = aliasesOf(s.SensitiveHostPaths)
	e.writeProtected = aliasesOf(s.WriteProtectedHostPaths)
	e.writable = aliasesOf(s.WritablePaths())
	e.runtimeState = aliasesOf(s.RuntimeStateHostPaths)
	e.readOnlyState = aliasesOf(s.ReadOnlyRuntimeStatePaths)
	e.named = namedPaths(s.WritablePaths(), s.WriteProtectedHostPaths)
	e.addable = setOf(addableCapabilities(s))
	return e, nil
}

// Policy returns the policy the engine enforces.
func (e *Engine) Policy() *config.Policy { return e.policy }

// isGPUResource reports whether a resource name makes a container a GPU container.
func (e *Engine) isGPUResource(name string) bool {
	if e.gpuExact[name] {
		return true
	}
	for _, g := range e.gpuGlobs {
		if ok, _ := path.Match(g, name); ok {
			return true
		}
	}
	return false
}

// isDeviceVar reports whether the toolkit reads name as a device list.
func (e *Engine) isDeviceVar(name string) bool {
	return slices.Contains(e.deviceVars, name)
}

func setOf(items []string) map[string]bool {
	m := make(map[string]bool, len(items))
	for _, i := range items {
		m[i] = true
	}
	return m
}
