package framework

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
)

// RunRootSuite is the TestMain of a suite that runs a node (e2e/node,
// e2e/cluster): it skips with one line where this machine cannot run one,
// else calls run with the repository root (two levels above the suite) and
// exits with its code, or 1 and the error.
func RunRootSuite(m *testing.M, suite string, run func(m *testing.M, repoRoot string) (int, error)) {
	if reason := NodeReadiness(); reason != nil {
		fmt.Printf("%s: skipped: %v\n", suite, reason)
		os.Exit(0)
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	code := 1
	if err == nil {
		code, err = run(m, root)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, suite+":", err)
		code = 1
	}
	os.Exit(code)
}

// StopOnSignal calls stop and exits when the suite is interrupted, so that
// no daemon, shim or network rule outlives it.
func StopOnSignal(suite string, stop func(context.Context)) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-sig
		fmt.Fprintf(os.Stderr, "%s: interrupted, stopping\n", suite)
		stop(context.Background())
		os.Exit(2)
	}()
}
