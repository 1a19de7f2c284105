package cli

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/gpuguard/gpuguard/cel"
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
cannot express exactly is left to the webhook and listed at the top of the output.`,
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
			return writeCEL(cmd.OutOrStdout(), source, policies)
		},
	}
	cmd.Flags().StringVar(&policyFile, "policy", "", "policy document, or a ConfigMap manifest holding it (default: the built-in policy)")
	cmd.Flags().StringArrayVar(&opts.ExcludedNamespaces, "exclude-namespace", nil, "namespace to leave out, like the webhooks' namespaceSelector (repeatable; kube-system and kube-node-lease always are)")
	cmd.Flags().StringVar(&opts.Name, "name", cel.DefaultName, "name of the policies and bindings")
	return cmd
}

func writeCEL(w io.Writer, source string, p *cel.Policies) error {
	fmt.Fprintf(w, "# gpuguard CEL backstop, rendered from %s.\n# Enforced by the webhook only:\n", source)
	for _, g := range cel.WebhookOnly {
		fmt.Fprintf(w, "#   - %s: %s\n", g.Rule, g.Why)
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
