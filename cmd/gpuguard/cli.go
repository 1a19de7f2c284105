package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/gpuguard/gpuguard/config"
)

// version is set at build time with
// -ldflags "-X main.version=...".
var version = ""

// exitError carries an exit status; its message, if any, is printed to stderr.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// Exit statuses shared by the subcommands.
const (
	exitOK     = 0
	exitDenied = 1
	exitFailed = 1 // verify: the cluster did not answer as expected; cleanup: something stayed
	exitUsage  = 2
)

// Run runs the gpuguard command line and returns its exit status; main only
// dispatches to it.
func Run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := &cobra.Command{
		Use:           "gpuguard",
		Short:         "Keep pods from reaching NVIDIA GPUs they were not allocated",
		Long:          "gpuguard keeps pods from reaching NVIDIA GPUs they were not allocated.\nSubcommands: check (offline, for CI), audit (what already runs in a cluster), webhook (the admission webhook),\nrender-cel (the CEL backstop), verify (checks a cluster's gpuguard with a dry-run pod), policy (the built-in policy),\nrules (what each rule judges), version.",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.Version = buildVersion()
	root.SetVersionTemplate("gpuguard {{.Version}}\n")
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddCommand(newCheckCommand(), newCleanupCommand(), newAuditCommand(), newWebhookCommand(), newRenderCELCommand(), newVerifyCommand(), newVersionCommand(),
		newPolicyCommand(), newRulesCommand())
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	var ee *exitError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ee):
		if ee.msg != "" {
			fmt.Fprintln(stderr, "gpuguard:", ee.msg)
		}
		return ee.code
	}
	// Flag and argument errors from cobra are usage errors.
	fmt.Fprintln(stderr, "gpuguard:", err)
	fmt.Fprintln(stderr, "Run 'gpuguard --help' for usage.")
	return exitUsage
}

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintln(cmd.OutOrStdout(), "gpuguard", buildVersion())
		},
	}
}

func buildVersion() string {
	if version != "" {
		return version
	}
	if info, ok := debug.ReadBuildInfo(); ok && info.Main.Version != "" {
		return info.Main.Version
	}
	return "(devel)"
}

// loadPolicyFile reads --policy's file for check and render-cel: a usage
// error either way, naming what is wrong.
func loadPolicyFile(path string) (*config.Policy, error) {
	p, err := config.ReadFile(path)
	var invalid *config.InvalidError
	switch {
	case errors.As(err, &invalid):
		return nil, &exitError{exitUsage, "invalid policy:\n" + err.Error()}
	case err != nil:
		return nil, &exitError{exitUsage, err.Error()}
	}
	return p, nil
}
