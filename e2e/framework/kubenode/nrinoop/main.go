// Command nrinoop is an NRI plugin that subscribes to container creation
// and changes nothing: the node benchmark's reference for what any NRI
// plugin costs a container's creation at the node's containerd, beside
// which gpuguard's enforcer is measured.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

// registered is what the plugin prints once the runtime has registered it
// (framework.Node.StartNoopNRIPlugin waits for it).
const registered = "nrinoop registered"

type plugin struct{}

func (plugin) CreateContainer(context.Context, *api.PodSandbox, *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	return nil, nil, nil
}

func main() {
	socket := flag.String("nri-socket", "", "the runtime's NRI socket")
	flag.Parse()
	// It serves until the runtime closes the connection or stops it.
	fmt.Fprintln(os.Stderr, "nrinoop:", run(*socket))
	os.Exit(1)
}

// run serves the runtime until it closes the connection; it returns why it
// stopped.
func run(socket string) error {
	if socket == "" {
		return fmt.Errorf("--nri-socket is required")
	}
	// The enforcer's index, so that both sit at the same place among the
	// runtime's plugins.
	s, err := stub.New(plugin{}, stub.WithPluginName("nrinoop"), stub.WithPluginIdx("90"), stub.WithSocketPath(socket))
	if err != nil {
		return err
	}
	ctx := context.Background()
	if err := s.Start(ctx); err != nil {
		return err
	}
	fmt.Println(registered)
	s.Wait()
	return fmt.Errorf("the runtime closed the NRI connection")
}
