package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/gpuguard/gpuguard/cel"
	"github.com/gpuguard/gpuguard/cel/celcost"
	"github.com/gpuguard/gpuguard/config"
)

func newRenderCELCommand() *cobra.Command {
	var policyFile string
	var opts cel.Options
	cmd := &cobra.Command{
		Use:   "render-cel [--policy FILE] [--exclude-namespace NS]...",
		Short: "Print the policy as ValidatingAdmissionPolicy and MutatingAdmissionPolicy manifests (the CEL backstop)",
		Long: `render-cel prints the policy's core rules as admission policies that the API
server evaluates itself (Kubernetes 1.36+ serves both as v1): a
ValidatingAdmissionPolicy and a MutatingAdmissionPolicy (the void injection), with
their bindings. They keep enforcing when the webhook is unreachable. What CEL
cannot express exactly is left to the webhook and listed at the top of the output,
followed by what each part costs the API server at runtime on reference pods,
against the budgets it enforces.`,
		Example: `  gpuguard render-cel | kubectl apply -f -
  gpuguard render-cel --policy policy.yaml --exclude-namespace gpuguard --exclude-namespace calico-system`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p := config.Default()
			source := "the built-in default policy"
			if policyFile != "" {
				var err error
				if p, err = loadPolicyFile(policyFile); err != nil {
					return err
				}
				source = policyFile
			}
			policies, err := cel.Render(p, opts)
			if err != nil {
				return &exitError{exitUsage, err.Error()}
			}
			prefilter, err := cel.Prefilter(p)
			if err != nil {
				return &exitError{exitUsage, err.Error()}
			}
			return writeCEL(cmd.Context(), cmd.OutOrStdout(), source, policies, prefilter)
		},
	}
	cmd.Flags().StringVar(&policyFile, "policy", "", "policy document, or a ConfigMap manifest holding it (default: the built-in policy)")
	cmd.Flags().StringArrayVar(&opts.ExcludedNamespaces, "exclude-namespace", nil, "namespace to leave out, like the webhooks' namespaceSelector (repeatable; kube-system and kube-node-lease always are)")
	cmd.Flags().StringVar(&opts.Name, "name", cel.DefaultName, "name of the policies and bindings")
	return cmd
}

func writeCEL(ctx context.Context, w io.Writer, source string, p *cel.Policies, prefilter string) error {
	fmt.Fprintf(w, "# gpuguard CEL backstop, rendered from %s.\n# Enforced by the webhook only:\n", source)
	for _, g := range cel.WebhookOnly {
		fmt.Fprintf(w, "#   - %s: %s\n", g.Rule, g.Why)
	}
	if err := writeCosts(ctx, w, p, prefilter); err != nil {
		return err
	}
	for _, obj := range p.Objects() {
		data, err := sigsyaml.Marshal(obj)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "---\n%s", data)
	}
	return nil
}

// writeCosts writes, as comments, the runtime cost of each budgeted part of
// the backstop and of the webhooks' pre-filter on the reference pods. The
// API server estimates no static cost for admission policies (their object
// is untyped), so this is the count it enforces, with the same library.
func writeCosts(ctx context.Context, w io.Writer, p *cel.Policies, prefilter string) error {
	meter, err := celcost.New(p, prefilter)
	if err != nil {
		return fmt.Errorf("the rendered policies do not compile as the API server compiles them: %w", err)
	}
	refs := celcost.References()
	costs := make([][]celcost.Cost, len(refs))
	for i, r := range refs {
		if costs[i], err = meter.Measure(ctx, celcost.Request{Namespace: r.Pod.Namespace, Object: r.Pod}); err != nil {
			return fmt.Errorf("runtime cost on the %s pod: %w", r.Name, err)
		}
	}
	fmt.Fprintf(w, "# Runtime CEL cost, as the API server counts it, of each part when it runs (the\n"+
		"# validations run only for pods the match conditions let through), against its\n"+
		"# budget and a limit of %d per expression; over either, the configuration\n"+
		"# fails, and gpuguard's fail closed:\n", celcost.ExpressionLimit)
	width := 0
	for _, c := range costs[0] {
		width = max(width, len(c.Part)+1)
	}
	fmt.Fprintf(w, "#   %-*s %9s %9s %10s\n", width, "", refs[0].Name, refs[1].Name, "budget")
	var failures []string
	cell := func(ref string, c celcost.Cost) string {
		if c.Err != nil {
			failures = append(failures, fmt.Sprintf("#   %s on the %s pod: %v", c.Part, ref, c.Err))
			return "FAILS"
		}
		return strconv.FormatInt(c.Cost, 10)
	}
	for j, c := range costs[0] {
		fmt.Fprintf(w, "#   %-*s %9s %9s %10d\n", width, c.Part+":", cell(refs[0].Name, c), cell(refs[1].Name, costs[1][j]), c.Budget)
	}
	for _, f := range failures {
		fmt.Fprintln(w, strings.ReplaceAll(f, "\n", " "))
	}
	for _, r := range refs {
		fmt.Fprintf(w, "#   %s: %s\n", r.Name, r.Description)
	}
	return nil
}
