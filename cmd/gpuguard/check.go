package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/internal/manifest"
	"github.com/gpuguard/gpuguard/policy"
)

type checkOptions struct {
	stderr     io.Writer
	policyFile string
	// values render the policy the chart installs, instead of policyFile.
	values chartValues
	mode   string
	// namespace is where objects without one are judged, as kubectl apply -n
	// would create them.
	namespace string
	out       outputOptions
	// kindsFile adds kinds to the built-in table of kinds whose pods are
	// found at known paths; kinds is the table.
	kindsFile string
	kinds     manifest.Kinds
	// ignore are globs on file paths and on KIND/NAMESPACE/NAME: what they
	// match is not judged.
	ignore []string
}

func newCheckCommand() *cobra.Command {
	o := &checkOptions{}
	cmd := &cobra.Command{
		Use:   "check [--policy FILE | --values FILE...] [--mode enforce|warn|audit] [-n NAMESPACE] [-o text|json|sarif] [-q] [--fail-on deny|warn|skip] [--kinds FILE] [--ignore PATTERN]... PATH...",
		Short: "Report what the API server would do with pods and pod controllers, offline",
		Long: `check reports, for every pod, pod controller and Binding in the given files,
what gpuguard would do at admission: the mutating phase, then the validating phase
on the mutated object.

PATH is a YAML or JSON file (several documents, or kind: List), a directory
(walked for *.yaml, *.yml and *.json) or - for standard input. ConfigMaps in the
input serve envFrom inspection and Namespaces their gpuguard.io/mode label.
Custom resources are judged through the pods their operators will create:
GPU job kinds (Kubeflow, KServe, Knative, Argo Workflows, Tekton, Spark,
Ray, JobSet, LeaderWorkerSet, Volcano) from a table that --kinds extends,
other kinds wherever a pod template sits. Kinds without a pod, and documents
that are no Kubernetes object (a kustomization, a CI workflow), are skipped
with a note; --fail-on skip makes a skip fail the run. --ignore leaves out
files, directories or KIND/NAMESPACE/NAME matching a glob.
Objects without a namespace are in the one --namespace names ("default"),
where a namespace exemption applies to them.
Pods and pod controllers are decoded strictly, as the API server does: an
unknown or duplicate field is an error, not a field ignored.

A document that does not parse fails the run, but every other document is
still reported. Empty input (an upstream command that failed) is an error.
For what already runs in a cluster, use gpuguard audit.

--values (and --set) judge with the policy the Helm chart installs with those
values, presets and exemptions included (gpuguard policy --values prints it).

With --policy or --values and no PATH, check only validates the policy (a
document, or a ConfigMap manifest holding it), as the webhook would load it.

Exit status: 0 when every object is allowed (a patch or a warning still counts as
allowed, unless --fail-on warn), 1 when any is denied (or, with --fail-on skip,
skipped), 2 for usage errors, unreadable or unparsable
documents, and empty input.`,
		Example: `  gpuguard check examples/
  kubectl kustomize overlays/prod | gpuguard check -o json -
  gpuguard check -q --policy gpuguard-policy.yaml --mode warn manifests/
  gpuguard check --values values.yaml manifests/   # the policy the chart installs
  gpuguard check -o sarif manifests/ > gpuguard.sarif
  gpuguard check --fail-on deny,skip --kinds gpu-kinds.yaml --ignore 'third_party' workflows/
  gpuguard check --policy gpuguard-policy-configmap.yaml`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				if o.policyFile == "" && !o.values.given() {
					return &exitError{exitUsage, "name the manifests to check (PATH, or - for standard input), or a --policy or --values to validate"}
				}
				return o.validatePolicy(cmd.OutOrStdout(), cmd.ErrOrStderr())
			}
			o.values.stdin = cmd.InOrStdin()
			return o.run(cmd.Context(), args, cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	cmd.Flags().StringVar(&o.policyFile, "policy", "", "policy document, or a ConfigMap manifest holding it under policy.yaml (default: the built-in policy)")
	o.values.addFlags(cmd.Flags())
	cmd.Flags().StringVar(&o.mode, "mode", "", "override the policy's mode: enforce, warn or audit")
	cmd.Flags().StringVarP(&o.namespace, "namespace", "n", "default", "the namespace of objects that name none, as kubectl apply -n would create them (a namespace exemption then applies)")
	cmd.Flags().StringVar(&o.kindsFile, "kinds", "", "YAML file of custom resource kinds and the paths of their pod templates, pod specs or containers (see docs/cli.md), beside the built-in ones")
	cmd.Flags().StringArrayVar(&o.ignore, "ignore", nil, "do not judge what matches this glob: a file path (or a directory above it, or a file's base name), or KIND/NAMESPACE/NAME; repeatable")
	o.out.addFlags(cmd.Flags())
	return cmd
}

// ignored says whether an --ignore pattern matches the document's file, a
// directory above it, its base name, or its KIND/NAMESPACE/NAME.
func (o *checkOptions) ignored(d manifest.Document, namespace string) bool {
	if len(o.ignore) == 0 {
		return false
	}
	id := d.GVK.Kind + "/" + namespace + "/" + d.Meta.Name
	src := filepath.ToSlash(strings.TrimSuffix(d.Source, kustomizeSuffix))
	for _, p := range o.ignore {
		if ok, _ := path.Match(p, id); ok {
			return true
		}
		if d.Source == manifest.StdinName {
			continue
		}
		if ok, _ := path.Match(p, path.Base(src)); ok {
			return true
		}
		for s := path.Clean(src); s != "." && s != "/" && s != ""; s = path.Dir(s) {
			if ok, _ := path.Match(p, s); ok {
				return true
			}
		}
	}
	return false
}

// kustomizeSuffix ends the source of documents a kustomization built.
const kustomizeSuffix = " (kustomize build)"

// checkedObject is one element of `check -o json`: a contract for scripts.
type checkedObject struct {
	APIVersion string             `json:"apiVersion"`
	Kind       string             `json:"kind"`
	Namespace  string             `json:"namespace"`
	Name       string             `json:"name"`
	Source     string             `json:"source"`
	Allowed    bool               `json:"allowed"`
	Mode       config.Mode        `json:"mode"`
	Exempt     string             `json:"exempt,omitempty"`
	Violations []policy.Violation `json:"violations"`
	// OmittedViolations are not listed (past the first policy.MaxFindings
	// findings), and OmittedRules are their rules.
	OmittedViolations int                   `json:"omittedViolations,omitempty"`
	OmittedRules      []policy.RuleID       `json:"omittedRules,omitempty"`
	Warnings          []policy.Warning      `json:"warnings"`
	AuditAnnotations  map[string]string     `json:"auditAnnotations,omitempty"`
	Patch             []jsonpatch.Operation `json:"patch"`
	// TemplateVoid names, for a pod controller, the containers its pods will
	// get void in.
	TemplateVoid []string `json:"templateVoid,omitempty"`
	// Line is where the object's document starts in its file (check
	// only); for a pod embedded in a custom resource, where it sits.
	Line int `json:"line,omitempty"`
	// Path is where an embedded pod sits in its custom resource
	// (spec.templates[0]), for which Name ends with it too.
	Path string `json:"path,omitempty"`
	// Error, on an entry of its own, is an input that could not be judged
	// (a document that does not parse, a file that cannot be read): its
	// source and line where known, and why. Such an entry is not allowed.
	Error    string `json:"error,omitempty"`
	decision policy.Decision
	// doc is the object's document, for SARIF locations (check only).
	doc *manifest.Document
}

func (o *checkOptions) run(ctx context.Context, paths []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if ctx == nil {
		ctx = context.Background()
	}
	if err := o.out.validate(); err != nil {
		return err
	}
	o.stderr = stderr
	if slices.Contains(paths, "-") && slices.Contains(o.values.files, "-") {
		return &exitError{exitUsage, "standard input (-) can serve the manifests or a --values file, not both"}
	}
	engine, err := o.engine()
	if err != nil {
		return err
	}
	docs, readErrs := manifest.Read(paths, stdin)
	if len(docs) == 0 && len(readErrs) == 0 {
		return &exitError{exitUsage, "no documents in the input: did the command that produced it fail?"}
	}
	if msgs := validation.IsDNS1123Label(o.namespace); len(msgs) > 0 {
		return &exitError{exitUsage, fmt.Sprintf("--namespace %q: %s", o.namespace, strings.Join(msgs, "; "))}
	}
	for _, p := range o.ignore {
		if _, err := path.Match(p, ""); err != nil {
			return &exitError{exitUsage, fmt.Sprintf("--ignore %q: %v", p, err)}
		}
	}
	o.kinds = manifest.BuiltinKinds()
	if o.kindsFile != "" {
		if err := o.kinds.LoadKinds(o.kindsFile); err != nil {
			return &exitError{exitUsage, "--kinds: " + err.Error()}
		}
	}
	inputs := newCheckInputs(docs, o.namespace)
	inputs.kinds = o.kinds
	var results []checkedObject
	var skipped []string
	for _, d := range docs {
		if o.ignored(d, inputs.namespaceOf(d)) {
			continue
		}
		switch {
		case d.NotObject != "":
			skipped = append(skipped, fmt.Sprintf("%s: %s", d.Location(), d.NotObject))
		case d.Object != nil && policy.Supported(d.Object):
			r, err := inputs.admit(ctx, engine, d)
			if err != nil {
				readErrs = append(readErrs, fmt.Errorf("%s: %v", d.Location(), err))
				continue
			}
			results = append(results, r)
		case d.GVK.Kind != "ConfigMap" && d.GVK.Kind != "Namespace":
			embedded, err := inputs.admitEmbedded(ctx, engine, d)
			if err != nil {
				readErrs = append(readErrs, fmt.Errorf("%s: %v", d.Location(), err))
			}
			if len(embedded) == 0 && err == nil {
				why := "not a pod or pod controller, and no pod template inside (name its kind with --kinds)"
				if inputs.kinds.Lookup(d.GVK.GroupVersion().String(), d.GVK.Kind) != nil {
					why = "no pod described inside (a task or runtime referenced by name is judged in its own document)"
				}
				skipped = append(skipped, fmt.Sprintf("%s %s (%s): %s", d.GVK.Kind, displayName(d), d.Location(), why))
			}
			results = append(results, embedded...)
		}
	}
	err = o.out.write(stdout, stderr, append(results, inputErrors(readErrs)...), skipped)
	if len(readErrs) > 0 {
		return &exitError{exitUsage, joinErrors(readErrs)}
	}
	return err
}

// validatePolicy loads --policy, or the chart's policy for --values, as the
// webhook would and says whether it would be put in force.
func (o *checkOptions) validatePolicy(stdout, stderr io.Writer) error {
	o.stderr = stderr
	e, err := o.engine()
	if err != nil {
		return err
	}
	name := "policy " + o.policyFile
	if o.values.given() {
		name = o.values.source()
	}
	fmt.Fprintf(stdout, "%s is valid (mode %s)\n", name, e.Policy().Spec.Mode)
	return nil
}

func (o *checkOptions) engine() (*policy.Engine, error) {
	p := config.Default()
	var err error
	switch {
	case o.policyFile != "" && o.values.given():
		return nil, &exitError{exitUsage, "--policy and --values both name the policy: use one"}
	case o.values.given():
		if p, _, err = o.values.policy(); err != nil {
			return nil, err
		}
	case o.policyFile != "":
		if p, err = loadPolicyFile(o.policyFile); err != nil {
			return nil, err
		}
	}
	for _, advice := range config.Advice(p) {
		fmt.Fprintln(o.stderr, "gpuguard: policy:", advice)
	}
	if err := overrideMode(p, o.mode); err != nil {
		return nil, err
	}
	e, err := policy.New(p)
	if err != nil {
		return nil, &exitError{exitUsage, err.Error()}
	}
	return e, nil
}

// overrideMode sets the policy's mode to --mode, when given: check and
// audit then judge as a policy in that mode would.
func overrideMode(p *config.Policy, mode string) error {
	if mode == "" {
		return nil
	}
	if config.Mode(mode).Strictness() == 0 {
		return &exitError{exitUsage, fmt.Sprintf("--mode %q: use enforce, warn or audit", mode)}
	}
	p.Spec.Mode = config.Mode(mode)
	return nil
}

// checkInputs holds what the input offers besides the objects under check: ConfigMaps
// for envFrom inspection and Namespace labels.
type checkInputs struct {
	configMaps      map[string]map[string]string // namespace/name -> data
	namespaceLabels map[string]map[string]string
	// namespace is where objects without one are judged.
	namespace string
	// kinds is where the pods of custom resources are.
	kinds manifest.Kinds
}

func newCheckInputs(docs []manifest.Document, namespace string) *checkInputs {
	in := &checkInputs{configMaps: map[string]map[string]string{}, namespaceLabels: map[string]map[string]string{}, namespace: namespace}
	for _, d := range docs {
		switch d.GVK.Kind {
		case "ConfigMap":
			if cm, ok := d.Object.(*corev1.ConfigMap); ok {
				in.configMaps[in.namespaceOf(d)+"/"+d.Meta.Name] = cm.Data
			}
		case "Namespace":
			in.namespaceLabels[d.Meta.Name] = d.Meta.Labels
		}
	}
	return in
}

func (in *checkInputs) ConfigMapData(_ context.Context, namespace, name string) (map[string]string, error) {
	data, ok := in.configMaps[namespace+"/"+name]
	if !ok {
		return nil, policy.ErrConfigMapNotFound
	}
	return data, nil
}

func (in *checkInputs) admit(ctx context.Context, e *policy.Engine, d manifest.Document) (checkedObject, error) {
	ns := in.namespaceOf(d)
	r, err := e.Admit(ctx, policy.Request{
		Operation:       admissionv1.Create,
		Namespace:       ns,
		Object:          d.Object,
		NamespaceLabels: in.namespaceLabels[ns],
		ConfigMaps:      in,
	})
	if err != nil {
		return checkedObject{}, err
	}
	o := newCheckedObject(d.GVK.GroupVersion().String(), d.GVK.Kind, ns, displayName(d), d.Location(), r)
	o.Line, o.doc = d.Line, &d
	return o, nil
}

// admitEmbedded judges the pod templates inside an object of a kind the
// engine does not know (a PyTorchJob, a JobSet, a RayJob…), each as a
// PodTemplate named after the object and where the template sits: their
// operators create pods from them, which admission will judge. A List's
// items are not looked into (their documents are not kept apart).
func (in *checkInputs) admitEmbedded(ctx context.Context, e *policy.Engine, d manifest.Document) ([]checkedObject, error) {
	if d.Object != nil || d.Item > 0 || len(d.Raw) == 0 {
		return nil, nil
	}
	kinds := in.kinds
	if kinds == nil {
		kinds = manifest.BuiltinKinds()
	}
	found, _, err := kinds.PodTemplatesOf(d.GVK.GroupVersion().String(), d.GVK.Kind, d.Raw)
	var out []checkedObject
	var lineOf func(string) int
	for _, t := range found {
		pt := &corev1.PodTemplate{ObjectMeta: metav1.ObjectMeta{Name: d.Meta.Name, Namespace: d.Meta.Namespace}, Template: t.Template}
		ns := in.namespaceOf(d)
		r, aerr := e.Admit(ctx, policy.Request{Operation: admissionv1.Create, Namespace: ns, Object: pt,
			NamespaceLabels: in.namespaceLabels[ns], ConfigMaps: in})
		if aerr != nil {
			return out, aerr
		}
		// Findings name the fields where they sit in the object, not in
		// the pod template built from it.
		for i := range r.Violations {
			if r.Violations[i].Path != "" {
				r.Violations[i].Path = t.SourcePath(r.Violations[i].Path)
			}
		}
		for i := range r.Warnings {
			if r.Warnings[i].Path != "" {
				r.Warnings[i].Path = t.SourcePath(r.Warnings[i].Path)
			}
		}
		o := newCheckedObject(d.GVK.GroupVersion().String(), d.GVK.Kind, ns, displayName(d)+t.Path, d.Location(), r)
		if lineOf == nil {
			lineOf = d.FieldLines()
		}
		o.Path, o.Line, o.doc = strings.TrimPrefix(t.Path, "."), lineOf(t.Path), &d
		out = append(out, o)
	}
	return out, err
}

// newCheckedObject is one element of check's output contract, shared by check
// and audit.
func newCheckedObject(apiVersion, kind, namespace, name, source string, r policy.Result) checkedObject {
	return checkedObject{
		APIVersion: apiVersion, Kind: kind, Namespace: namespace, Name: name,
		Source: source, Allowed: r.Allowed, Mode: r.Mode, Exempt: r.Exempt,
		Violations: r.Violations, OmittedViolations: r.OmittedViolations, OmittedRules: r.OmittedRules,
		Warnings: r.Warnings, AuditAnnotations: r.AuditAnnotations, Patch: r.Patch, TemplateVoid: r.TemplateVoid, decision: r.Decision(),
	}
}

// namespaceOf is the object's namespace, else the one --namespace names.
func (in *checkInputs) namespaceOf(d manifest.Document) string {
	if d.Meta.Namespace != "" {
		return d.Meta.Namespace
	}
	return in.namespace
}

func displayName(d manifest.Document) string {
	if d.Meta.Name == "" && d.Meta.GenerateName != "" {
		return d.Meta.GenerateName + "*"
	}
	return d.Meta.Name
}

func joinErrors(errs []error) string {
	msgs := make([]string, len(errs))
	for i, err := range errs {
		msgs[i] = err.Error()
	}
	return strings.Join(msgs, "\ngpuguard: ")
}

// inputErrors are the inputs that could not be judged, as entries of the
// output, so that JSON and SARIF carry them, not only standard error.
func inputErrors(errs []error) []checkedObject {
	var out []checkedObject
	for _, err := range errs {
		for _, one := range splitJoined(err) {
			e := checkedObject{Error: one.Error()}
			if de := (*manifest.DocumentError)(nil); errors.As(one, &de) {
				e.Source, e.Line, e.Error = de.Source, de.Line, de.Problem
			}
			out = append(out, e)
		}
	}
	return out
}

// splitJoined unwraps errors.Join.
func splitJoined(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, splitJoined(e)...)
		}
		return out
	}
	return []error{err}
}
