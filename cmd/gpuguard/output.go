package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/pflag"
	"gomodules.xyz/jsonpatch/v2"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/gpuguard/gpuguard/policy"
)

// outputOptions are the output flags check and audit share.
type outputOptions struct {
	format string
	quiet  bool
	// failOn is what exits 1, comma-separated: deny (a denied object,
	// always), warn (also one that is only warned about), skip (also a
	// document skipped, judged by nothing).
	failOn string
}

// failsOn says whether --fail-on names what.
func (o *outputOptions) failsOn(what string) bool {
	return slices.Contains(strings.Split(o.failOn, ","), what)
}

func (o *outputOptions) addFlags(fl *pflag.FlagSet) {
	fl.StringVarP(&o.format, "output", "o", "text", "output format: text, json (a contract for scripts) or sarif (code-scanning annotations)")
	fl.BoolVarP(&o.quiet, "quiet", "q", false, "text output: print only objects that are denied, warned or mutated, and the summary")
	fl.StringVar(&o.failOn, "fail-on", "deny", "what exits 1, comma-separated: deny (an object denied), warn (also an object only warned about, for a warn-mode rollout), skip (also a document skipped: a kind with no pod gpuguard can find)")
}

func (o *outputOptions) validate() error {
	for _, f := range strings.Split(o.failOn, ",") {
		switch f {
		case "deny", "warn", "skip":
		default:
			return &exitError{exitUsage, fmt.Sprintf("--fail-on %q: use deny, warn or skip (comma-separated)", o.failOn)}
		}
	}
	switch o.format {
	case "text", "json", "sarif":
		return nil
	}
	return &exitError{exitUsage, fmt.Sprintf("-o %q: use text, json or sarif", o.format)}
}

// write writes results in the chosen format, and returns the denied exit
// status when anything was denied.
func (o *outputOptions) write(stdout, stderr io.Writer, results []checkedObject, skipped []string) error {
	var err error
	switch o.format {
	case "json":
		err = writeJSON(stdout, stderr, results, skipped)
	case "sarif":
		err = writeSARIF(stdout, results)
	default:
		printText(stdout, results, skipped, o.quiet)
	}
	if err != nil {
		return err
	}
	for _, r := range results {
		if r.Error == "" && (!r.Allowed || (o.failsOn("warn") && len(r.Warnings) > 0)) {
			return &exitError{code: exitDenied}
		}
	}
	if o.failsOn("skip") && len(skipped) > 0 {
		return &exitError{exitDenied, fmt.Sprintf("%d documents skipped, judged by nothing (--fail-on skip): name their kinds with --kinds, or --ignore them", len(skipped))}
	}
	return nil
}

func writeJSON(stdout, stderr io.Writer, results []checkedObject, skipped []string) error {
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
	return nil
}

// printText writes one line per object, then its findings and patch,
// indented, and a summary. Quiet leaves out allowed objects and skips.
func printText(w io.Writer, results []checkedObject, skipped []string, quiet bool) {
	counts := map[string]int{}
	judged := 0
	for _, r := range results {
		if r.Error != "" {
			continue // on standard error already
		}
		judged++
		verdict := verdictOf(r)
		counts[verdict]++
		if quiet && verdict == "ALLOW" {
			continue
		}
		fmt.Fprintf(w, "%-7s %s %s/%s (%s)\n", verdict, r.Kind, r.Namespace, r.Name, r.Source)
		printDetails(w, r)
	}
	if !quiet {
		for _, s := range skipped {
			fmt.Fprintf(w, "%-7s %s\n", "SKIP", s)
		}
	}
	fmt.Fprintf(w, "\n%d objects: %d allowed, %d mutated, %d warned, %d denied; %d skipped\n",
		judged, counts["ALLOW"], counts["MUTATE"], counts["WARN"], counts["DENY"], len(skipped))
}

func printDetails(w io.Writer, r checkedObject) {
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
		// check has the room for the whole message, which an admission
		// warning may shorten.
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
	if len(r.TemplateVoid) > 0 {
		fmt.Fprintf(w, "        its pods get NVIDIA_VISIBLE_DEVICES=void in: %s (no GPU limit)\n", strings.Join(r.TemplateVoid, ", "))
	}
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
