// Command gpuguard keeps pods from reaching NVIDIA GPUs the scheduler did not give
// them. Subcommands: check (offline, for CI pipelines), webhook, render-cel, verify
// (a live cluster's gpuguard, by a dry run) and version.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...".
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
	exitFailed = 1 // verify: the cluster did not answer as expected
	exitUsage  = 2
)

func main() {
	// SIGTERM and SIGINT cancel the context: the webhook finishes the reviews in
	// flight, then exits.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := &cobra.Command{
		Use:           "gpuguard",
		Short:         "Keep pods from reaching NVIDIA GPUs they were not allocated",
		Long:          "gpuguard keeps pods from reaching NVIDIA GPUs they were not allocated.\nSubcommands: check (offline, for CI), audit (what already runs in a cluster), webhook (the admission webhook),\nrender-cel (the CEL backstop), verify (checks a cluster's gpuguard with a dry-run pod), version.",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddCommand(newCheckCommand(), newAuditCommand(), newWebhookCommand(), newRenderCELCommand(), newVerifyCommand(), newVersionCommand())
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
