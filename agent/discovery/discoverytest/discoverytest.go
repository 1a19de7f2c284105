// Package discoverytest gives tests the inventory of one of go-nvml's mock nodes.
package discoverytest

import (
	"testing"

	"github.com/gpuguard/gpuguard/agent/discovery"
)

// Inventory discovers a mock node (a backend spec such as "mock:dgxa100") named
// node-1, failing the test when it cannot.
func Inventory(t testing.TB, spec string) *discovery.Inventory {
	t.Helper()
	b, err := discovery.OpenBackend(spec, "node-1", "")
	if err != nil {
		t.Fatal(err)
	}
	inv, err := discovery.Discover(b.Lib, discovery.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return inv
}
