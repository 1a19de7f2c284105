//go:build e2e

// Package scale is the scale suite: gpuguard against a fleet of simulated
// GPU nodes. A kube-apiserver and etcd built from pinned sources, KWOK
// (sigs.k8s.io/kwok, built the same way) keeping a fleet of Node objects
// alive and their pods running, and the real `gpuguard webhook` binary with
// its background audit and OpenReports. It measures what grows with the
// fleet: the audit's duration, memory, API requests and Reports, the
// webhook's memory with its caches, and the fleet's agent heartbeats: their
// writes and what following them costs the webhook. make test runs a small fleet; make scale
// the one of docs/reliability.md (1,000 nodes, 30,000 pods, 300 namespaces).
package scale

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/gpuguard/gpuguard/e2e/framework/controlplane"
)

var (
	nodeCount      = flag.Int("scale.nodes", 100, "simulated GPU nodes")
	podCount       = flag.Int("scale.pods", 3000, "pods, spread over the namespaces and nodes")
	namespaceCount = flag.Int("scale.namespaces", 30, "namespaces the pods are spread over")
)

var s struct {
	root string
	cp   *controlplane.ControlPlane
	kwok *controlplane.KWOK
}

func TestMain(m *testing.M) {
	flag.Parse()
	// The suite's controller-runtime client logs nothing worth reading.
	ctrllog.SetLogger(logr.Discard())
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e/scale:", err)
		code = 1
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	root, err := filepath.Abs("../..")
	if err != nil {
		return 1, err
	}
	assets := filepath.Join(root, "_output", "bin")
	cp, err := controlplane.StartControlPlane(assets)
	if err != nil {
		return 1, err
	}
	defer cp.Stop()
	s.root, s.cp = root, cp
	// Every node is KWOK's to keep alive: this control plane has no kubelet.
	if s.kwok, err = controlplane.StartKWOK(cp, assets); err != nil {
		return 1, err
	}
	defer s.kwok.Stop()
	return m.Run(), nil
}
