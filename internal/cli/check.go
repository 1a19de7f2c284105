package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/internal/manifest"
	"github.com/gpuguard/gpuguard/policy"
)

type checkOptions struct {
	stderr     io.Writer
	policyFile string
	mode       string
	output     string
}

func newCheckCommand() *cobra.Command {
	o := &checkOptions{}
	cmd := &cobra.Command{
		Use:   "check [--policy FILE] [--mode enforce|warn|audit] [-o text|json] PATH...",
		Short: "Report what the API server would do with pods and pod controllers, offline",
		Long: `check reports, for every pod, pod controller and Binding in the given files,
what gpuguard would do at admission: the mutating phase, then the validating phase
on the mutated object.

PATH is a YAML or JSON file (several documents, or kind: List), a directory
(walked for *.yaml, *.yml and *.json) or - for standard input. ConfigMaps in the
input serve envFrom inspection and Namespaces their gpuguard.io/mode label;
other kinds are skipped. Objects without a namespace are in "default".

Exit status: 0 when every object is allowed (a patch or a warning still counts as
allowed), 1 when any is denied, 2 for usage, read or parse errors.`,
		Example: `  gpuguard check examples/
  kubectl kustomize overlays/prod | gpuguard check -o json -
  gpuguard check --policy gpuguard-policy.yaml --mode warn manifests/`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.run(cmd.Context(), args, cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	cmd.Flags().StringVar(&o.policyFile, "policy", "", "policy document, or a ConfigMap manifest holding it under policy.yaml (default: the built-in policy)")
	cmd.Flags().StringVar(&o.mode, "mode", "", "override the policy's mode: enforce, warn or audit")
	cmd.Flags().StringVarP(&o.output, "output", "o", "text", "output format: text or json")
	return cmd
}

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
	decision          policy.Decision
}

func (o *checkOptions) run(ctx context.Context, paths []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if ctx == nil {
		ctx = context.Background()
	}
	if o.output != "text" && o.output != "json" {
		return &exitError{exitUsage, fmt.Sprintf("-o %q: use text or json", o.output)}
	}
	o.stderr = stderr
	engine, err := o.engine()
	if err != nil {
		return err
	}
	docs, errs := manifest.Read(paths, stdin)
	if len(errs) > 0 {
		return &exitError{exitUsage, joinErrors(errs)}
	}
	inputs := newCheckInputs(docs)
	var results []checkedObject
	var skipped []string
	for _, d := range docs {
		switch {
		case d.Object != nil && policy.Supported(d.Object):
			r, err := inputs.admit(ctx, engine, d)
			if err != nil {
				return &exitError{exitUsage, fmt.Sprintf("%s: %v", d.Location(), err)}
			}
			results = append(results, r)
		case d.GVK.Kind != "ConfigMap" && d.GVK.Kind != "Namespace":
			skipped = append(skipped, fmt.Sprintf("%s %s (%s): not a pod or pod controller", d.GVK.Kind, displayName(d), d.Location()))
		}
	}
	return writeResults(stdout, stderr, o.output, results, skipped)
}

// writeResults writes results as text or as check's JSON contract, and
// returns the denied exit status when anything was denied.
func writeResults(stdout, stderr io.Writer, output string, results []checkedObject, skipped []string) error {
	if output == "json" {
		if results == nil {
			results = []checkedObject{}
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		if err := enc.Encode(results); err != nil {
			return err
		}
		for _, s := range skipped {
			fmt.Fprintln(stderr, "skipped:", s)
		}
	} else {
		printText(stdout, results, skipped)
	}
	for _, r := range results {
		if !r.Allowed {
			return &exitError{code: exitDenied}
		}
	}
	return nil
}

func (o *checkOptions) engine() (*policy.Engine, error) {
	p := config.Default()
	if o.policyFile != "" {
		var err error
		if p, err = loadPolicyFile(o.policyFile); err != nil {
			return nil, err
		}
	}
	for _, advice := range config.Advice(p) {
		fmt.Fprintln(o.stderr, "gpuguard: policy:", advice)
	}
	if o.mode != "" {
		if config.Mode(o.mode).Strictness() == 0 {
			return nil, &exitError{exitUsage, fmt.Sprintf("--mode %q: use enforce, warn or audit", o.mode)}
		}
		p.Spec.Mode = config.Mode(o.mode)
	}
	e, err := policy.New(p)
	if err != nil {
		return nil, &exitError{exitUsage, err.Error()}
	}
	return e, nil
}

// checkInputs holds what the input offers besides the objects under check: ConfigMaps
// for envFrom inspection and Namespace labels.
type checkInputs struct {
	configMaps      map[string]map[string]string // namespace/name -> data
	namespaceLabels map[string]map[string]string
}

func newCheckInputs(docs []manifest.Document) *checkInputs {
	in := &checkInputs{configMaps: map[string]map[string]string{}, namespaceLabels: map[string]map[string]string{}}
	for _, d := range docs {
		switch d.GVK.Kind {
		case "ConfigMap":
			if cm, ok := d.Object.(*corev1.ConfigMap); ok {
				in.configMaps[namespaceOf(d)+"/"+d.Meta.Name] = cm.Data
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
	ns := namespaceOf(d)
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
	return newCheckedObject(d.GVK.GroupVersion().String(), d.GVK.Kind, ns, displayName(d), d.Location(), r), nil
}

// newCheckedObject is one element of check's output contract, shared by check
// and audit.
func newCheckedObject(apiVersion, kind, namespace, name, source string, r policy.Result) checkedObject {
	return checkedObject{
		APIVersion: apiVersion, Kind: kind, Namespace: namespace, Name: name,
		Source: source, Allowed: r.Allowed, Mode: r.Mode, Exempt: r.Exempt,
		Violations: r.Violations, OmittedViolations: r.OmittedViolations, OmittedRules: r.OmittedRules,
		Warnings: r.Warnings, AuditAnnotations: r.AuditAnnotations, Patch: r.Patch, decision: r.Decision(),
	}
}

func namespaceOf(d manifest.Document) string {
	if d.Meta.Namespace != "" {
		return d.Meta.Namespace
	}
	return "default"
}

func displayName(d manifest.Document) string {
	if d.Meta.Name == "" && d.Meta.GenerateName != "" {
		return d.Meta.GenerateName + "*"
	}
	return d.Meta.Name
}

// printText writes one line per object, then its violations, warnings and patch,
// indented, and a summary.
func printText(w io.Writer, results []checkedObject, skipped []string) {
	counts := map[string]int{}
	for _, r := range results {
		verdict := verdictOf(r)
		counts[verdict]++
		fmt.Fprintf(w, "%-7s %s %s/%s (%s)\n", verdict, r.Kind, r.Namespace, r.Name, r.Source)
		if r.Exempt != "" {
			fmt.Fprintf(w, "        exempt: %s\n", r.Exempt)
		}
		for _, v := range r.Violations {
			fmt.Fprintf(w, "        %s\n", v)
		}
		if r.OmittedViolations > 0 {
			fmt.Fprintf(w, "        and %d more violations %v\n", r.OmittedViolations, r.OmittedRules)
		}
		for _, s := range r.Warnings {
			// check has the room for the whole message, which an
			// admission warning may shorten.
			if s.Path == "" {
				fmt.Fprintf(w, "        warning: [%s]: %s\n", s.Rule, s.Message)
				continue
			}
			fmt.Fprintf(w, "        warning: %s [%s]: %s\n", s.Path, s.Rule, s.Message)
		}
		for _, k := range sets.List(sets.KeySet(r.AuditAnnotations)) {
			fmt.Fprintf(w, "        audit: %s=%s\n", k, r.AuditAnnotations[k])
		}
		for _, op := range r.Patch {
			fmt.Fprintf(w, "        patch: %s\n", describeOp(op))
		}
	}
	for _, s := range skipped {
		fmt.Fprintf(w, "%-7s %s\n", "SKIP", s)
	}
	fmt.Fprintf(w, "\n%d objects: %d allowed, %d mutated, %d warned, %d denied; %d skipped\n",
		len(results), counts["ALLOW"], counts["MUTATE"], counts["WARN"], counts["DENY"], len(skipped))
}

// verdictOf is the result's decision as check prints it; an exempt object
// is allowed untouched.
func verdictOf(r checkedObject) string {
	switch r.decision {
	case policy.DecisionDeny:
		return "DENY"
	case policy.DecisionWarn:
		return "WARN"
	case policy.DecisionMutate:
		return "MUTATE"
	}
	return "ALLOW"
}

func describeOp(op jsonpatch.Operation) string {
	if op.Value == nil {
		return op.Operation + " " + op.Path
	}
	v, _ := json.Marshal(op.Value)
	return op.Operation + " " + op.Path + " " + string(v)
}

func joinErrors(errs []error) string {
	msgs := make([]string, len(errs))
	for i, err := range errs {
		msgs[i] = err.Error()
	}
	return strings.Join(msgs, "\ngpuguard: ")
}
