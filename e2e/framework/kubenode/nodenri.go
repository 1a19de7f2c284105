package kubenode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gpuguard/gpuguard/e2e/framework"
)

// noopNRIRegistered is what e2e/framework/kubenode/nrinoop prints once containerd
// has registered it.
const noopNRIRegistered = "nrinoop registered"

// StartNoopNRIPlugin runs an NRI plugin that subscribes to container
// creation and changes nothing (e2e/framework/kubenode/nrinoop) on containerd's NRI
// socket, until StopNoopNRIPlugin, and waits until containerd has
// registered it: the node benchmark's reference for what any NRI plugin
// costs a container's creation.
func (n *Node) StartNoopNRIPlugin(ctx context.Context) error {
	if n.noopNRIBinary == "" {
		bin, err := framework.BuildBinary(n.repoRoot, n.Root, "nrinoop", "./e2e/framework/kubenode/nrinoop", false)
		if err != nil {
			return err
		}
		n.noopNRIBinary = bin
	}
	before := n.noopNRIRegistrations()
	d, err := framework.StartDaemon("nrinoop", filepath.Join(n.Root, "log"), nil, n.noopNRIBinary, "--nri-socket", n.NRISocket())
	if err != nil {
		return err
	}
	n.noopNRI = d
	err = framework.Poll(ctx, time.Minute, func() (bool, error) {
		if err := d.Exited(); err != nil {
			return false, err
		}
		return n.noopNRIRegistrations() > before, nil
	})
	if err != nil {
		return fmt.Errorf("no-op NRI plugin: %w\n%s", err, framework.Tail(d.Log))
	}
	return nil
}

// StopNoopNRIPlugin stops the plugin StartNoopNRIPlugin started, if any.
func (n *Node) StopNoopNRIPlugin() error {
	if n.noopNRI == nil {
		return nil
	}
	err := n.noopNRI.Stop(30 * time.Second)
	n.noopNRI = nil
	return err
}

// noopNRIRegistrations counts the no-op plugin's registrations so far (its
// log is appended to across starts).
func (n *Node) noopNRIRegistrations() int {
	data, _ := os.ReadFile(filepath.Join(n.Root, "log", "nrinoop.log"))
	return strings.Count(string(data), noopNRIRegistered)
}
