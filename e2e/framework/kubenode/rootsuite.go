package kubenode

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
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

// Interrupt handles SIGINT and SIGTERM for a suite or command that runs a
// node: Context is cancelled, so that a start in progress gives up and cleans
// up after itself; once SetStop has named how to stop what runs, that is
// called and the process exits, so that no daemon, shim or network rule
// outlives it.
type Interrupt struct {
	ctx  context.Context
	mu   sync.Mutex
	stop func(context.Context)
}

// OnInterrupt starts handling the signals for suite (a name for messages).
func OnInterrupt(suite string) *Interrupt {
	ctx, cancel := context.WithCancel(context.Background())
	i := &Interrupt{ctx: ctx}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-sig
		fmt.Fprintf(os.Stderr, "%s: interrupted, stopping\n", suite)
		cancel()
		i.mu.Lock()
		stop := i.stop
		i.mu.Unlock()
		if stop != nil {
			stop(context.Background())
			os.Exit(2)
		}
	}()
	return i
}

// Context is cancelled by the first signal.
func (i *Interrupt) Context() context.Context { return i.ctx }

// SetStop names what a signal stops from now on.
func (i *Interrupt) SetStop(stop func(context.Context)) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.stop = stop
}
