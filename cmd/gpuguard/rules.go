package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/policy"
)

// newPolicyCommand prints the built-in policy, the starting point of a
// policy of one's own (every field optional: what is left out keeps it).
func newPolicyCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "policy",
		Short: "Print the built-in policy, to copy and edit",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := cmd.OutOrStdout().Write(config.DefaultYAML())
			return err
		},
	}
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
