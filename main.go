// Command gpuguard keeps pods from reaching NVIDIA GPUs the scheduler did not give
// them. Subcommands: check (offline, for CI pipelines), audit, webhook,
// render-cel, verify (a live cluster's gpuguard, by a dry run) and version; they
// live in internal/cli.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/gpuguard/gpuguard/internal/cli"
)

func main() {
	// SIGTERM and SIGINT cancel the context: the webhook finishes the reviews in
	// flight, then exits.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
