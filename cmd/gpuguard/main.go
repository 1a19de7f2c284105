// Command gpuguard keeps pods from reaching NVIDIA GPUs the scheduler did not
// give them. Subcommands: check (offline, for CI pipelines), cleanup, audit,
// webhook, render-cel, verify (a live cluster's gpuguard, by a dry run),
// policy, rules and version. The webhook's server is the webhook package;
// this command parses its flags into a webhook.Config and runs it.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	// SIGTERM and SIGINT cancel the context: the webhook finishes the reviews in
	// flight, then exits.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := Run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
