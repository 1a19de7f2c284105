// Command localcluster runs a whole single-node Kubernetes cluster on this
// machine, built from the pinned sources (make node-binaries), with a
// registry on loopback holding gpuguard's images and chart, so that the README's
// "Install" can be followed without a cluster of one's own.
// It writes _output/kubeconfig, prints what to export, and runs until
// interrupted; then it stops everything and removes what it made. Needs root.
//
//	make cluster     # or: go run ./hack/localcluster
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/gpuguard/gpuguard/e2e/framework/controlplane"
	"github.com/gpuguard/gpuguard/e2e/framework/kubenode"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "localcluster:", err)
		os.Exit(1)
	}
}

func run() error {
	if err := kubenode.NodeReadiness(); err != nil {
		return fmt.Errorf("this machine cannot run a node: %w", err)
	}
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(root, "charts", "gpuguard")); err != nil {
		return errors.New("run it from the repository root")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fmt.Println("Starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd, kubelet and kube-proxy...")
	lc, err := kubenode.StartLocalCluster(ctx, root, "node-1")
	if err != nil {
		return err
	}
	kubeconfig := filepath.Join(root, "_output", "kubeconfig")
	registryCA := filepath.Join(root, "_output", "registry-ca.crt")
	dockerConfig := filepath.Join(root, "_output", "docker")
	err = writeKubeconfig(lc, kubeconfig)
	if err == nil {
		err = copyForSudoUser(lc.Registry.CAFile, registryCA)
	}
	if err == nil {
		// A registry as a team's is: behind credentials, which the README's
		// image pull secret takes from docker login's file.
		err = loginToRegistry(lc, dockerConfig)
	}
	if err == nil {
		fmt.Printf(`
The cluster is up for a day (its certificates expire then): one node with a pod
network and eight fake GPUs, and a registry on %[3]s holding gpuguard's
images and chart, which the node trusts. The node is not labelled as a GPU
node, so the chart's agent stays off it (docs/cluster-e2e.md shows how the
tests run it on the fake GPUs). In another terminal, from the repository root:

  export KUBECONFIG=%[1]s PATH=%[2]s:$PATH
  export REGISTRY=%[3]s SSL_CERT_FILE=%[4]s DOCKER_CONFIG=%[5]s

then follow "Install" in the README from step 1. The registry needs the
credentials DOCKER_CONFIG holds, as if docker login had written them.
Ctrl-C stops the cluster and removes what it made.
`, kubeconfig, lc.Assets, lc.Published.Registry, registryCA, dockerConfig)
		<-ctx.Done()
		fmt.Println("\nStopping the cluster...")
	}
	return errors.Join(err, lc.Stop(context.Background()), removeIfExists(kubeconfig), removeIfExists(registryCA), os.RemoveAll(dockerConfig))
}

// loginToRegistry protects the whole registry with credentials of its own
// and writes them where docker login would, into dir.
func loginToRegistry(lc *kubenode.LocalCluster, dir string) error {
	user, password := "newcomer", rand.Text()
	if err := controlplane.WriteDockerConfig(dir, lc.Published.Registry, user, password); err != nil {
		return err
	}
	if err := errors.Join(chownToSudoUser(dir), chownToSudoUser(filepath.Join(dir, "config.json"))); err != nil {
		return err
	}
	lc.Registry.Protect("", user, password)
	return nil
}

// writeKubeconfig writes an administrator's kubeconfig with its certificates
// inline, owned by the user who ran sudo, so that a shell of theirs can use it.
func writeKubeconfig(lc *kubenode.LocalCluster, path string) error {
	admin, err := lc.CP.Kubeconfig("local-admin")
	if err != nil {
		return err
	}
	cfg, err := clientcmd.LoadFromFile(admin)
	if err != nil {
		return err
	}
	if err := clientcmdapi.FlattenConfig(cfg); err != nil {
		return err
	}
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return err
	}
	return chownToSudoUser(path)
}

// copyForSudoUser copies a file where the user who ran sudo can read it.
func copyForSudoUser(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := os.WriteFile(dst, data, 0o644); err != nil {
		return err
	}
	return chownToSudoUser(dst)
}

func chownToSudoUser(path string) error {
	uid, err1 := strconv.Atoi(os.Getenv("SUDO_UID"))
	gid, err2 := strconv.Atoi(os.Getenv("SUDO_GID"))
	if err1 != nil || err2 != nil {
		return nil // not run through sudo: root keeps it
	}
	return os.Chown(path, uid, gid)
}

func removeIfExists(path string) error {
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}
