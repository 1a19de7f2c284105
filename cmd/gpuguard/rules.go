package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/policy"
)

// newPolicyCommand prints the built-in policy, the starting point of a
// policy of one's own (every field optional: what is left out keeps it), or
// with --values the policy the chart installs with those values.
func newPolicyCommand() *cobra.Command {
	values := &chartValues{}
	cmd := &cobra.Command{
		Use:   "policy [--values FILE]... [--set KEY=VALUE]...",
		Short: "Print the built-in policy, to copy and edit, or the one the chart installs with your values",
		Long: `policy prints the built-in policy, to copy and edit.

With --values (and --set), it prints the policy the Helm chart installs with
those values instead: the chart's own policy ConfigMap template, rendered from
the chart built into this binary, with policy.mode, policy.spec, the presets'
exemptions and resources and policy.document as the chart combines them. A
value the chart's schema rejects, or a combination its templates refuse, fails
as helm install would, naming the file. check --values and audit --values judge
with the same policy.`,
		Example: `  gpuguard policy > candidate.yaml
  gpuguard policy -f values.yaml
  gpuguard policy -f values.yaml --set policy.presets.gpuOperator.enabled=true`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			doc := config.DefaultYAML()
			if values.given() {
				values.stdin = cmd.InOrStdin()
				var err error
				if _, doc, err = values.policy(); err != nil {
					return err
				}
			}
			_, err := cmd.OutOrStdout().Write(doc)
			return err
		},
	}
	values.addFlags(cmd.Flags())
	return cmd
}

// newRulesCommand lists the rules: what each judges, and what the CEL
// backstop keeps of it while the webhook is down.
func newRulesCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "rules",
		Short: "List the rules, what each judges, and what the CEL backstop enforces of it",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "RULE\tBACKSTOP\tJUDGES")
			for _, r := range policy.Registry() {
				fmt.Fprintf(w, "%s\t%s\t%s\n", r.ID, backstopOf(r), r.Summary)
			}
			return w.Flush()
		},
	}
}

// backstopOf says what the CEL backstop renders of rule r: all of it,
// all but a declared gap, or nothing (left to the webhook). The two
// mutations are the MutatingAdmissionPolicy's.
func backstopOf(r *policy.Rule) string {
	switch {
	case r.ID == policy.RuleInjectVoid || r.ID == policy.RulePinParentGroups:
		return "yes (mutation)"
	case r.CEL == nil:
		return "webhook only"
	case r.Gap != "":
		return "yes, but a gap"
	}
	return "yes"
}
