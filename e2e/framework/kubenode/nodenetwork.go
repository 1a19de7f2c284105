package kubenode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/gpuguard/gpuguard/e2e/framework"
	"github.com/gpuguard/gpuguard/e2e/framework/controlplane"
)

// A node of a whole cluster (StartClusterControlPlane) wires its pods as a
// cluster's node does: the CNI bridge plugin gives each pod an address on a
// bridge of the host, and kube-proxy (nftables mode) routes Service addresses,
// the API server's among them, to their endpoints. Nodes of an envtest
// control plane have no pod network; their pods use the host's.

// cniConfigName is the node's CNI network configuration, in containerd's
// conf_dir.
const cniConfigName = "10-gpuguard-e2e.conflist"

// cniConfig is a bridge network on the cluster's pod range: the bridge is
// the pods' gateway, so pods reach the host and, through kube-proxy, Services.
func (n *Node) cniConfig(network controlplane.ClusterNetwork) ([]byte, error) {
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "gpuguard-e2e",
		"plugins": []any{
			map[string]any{
				"type": "bridge", "bridge": network.Bridge, "isGateway": true, "hairpinMode": true,
				"ipam": map[string]any{
					"type":    "host-local",
					"ranges":  [][]map[string]string{{{"subnet": network.PodCIDR}}},
					"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
					"dataDir": filepath.Join(n.Root, "cni-ipam"),
				},
			},
			map[string]any{"type": "loopback"},
		},
	}
	return json.MarshalIndent(conf, "", "  ")
}

func (n *Node) writeCNIConfig() error {
	if n.cp.Network == nil {
		return nil
	}
	if err := n.claimHostNetwork(); err != nil {
		return err
	}
	data, err := n.cniConfig(*n.cp.Network)
	if err != nil {
		return err
	}
	return writeFile(filepath.Join(n.Root, "cni", cniConfigName), string(data))
}

// kubeProxyConfig is kube-proxy's configuration: nftables mode, and no
// conntrack sysctls, which belong to the host, not to a test.
func (n *Node) kubeProxyConfig(kubeconfig string, healthzPort, metricsPort int) string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
hostnameOverride: %s
clusterCIDR: %s
clientConnection:
  kubeconfig: %s
healthzBindAddress: 127.0.0.1:%d
metricsBindAddress: 127.0.0.1:%d
conntrack:
  maxPerCore: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, n.Name, n.cp.Network.PodCIDR, kubeconfig, healthzPort, metricsPort)
}

func (n *Node) kubeProxyConfigPath() string {
	return filepath.Join(n.Root, "etc", "kube-proxy", "config.yaml")
}

// startKubeProxy starts kube-proxy with the identity the bootstrap RBAC
// policy grants its permissions to, and waits until it has programmed the
// Services.
func (n *Node) startKubeProxy(ctx context.Context) error {
	kubeconfig, err := n.cp.KubeconfigFor("system:kube-proxy")
	if err != nil {
		return err
	}
	ports, err := framework.FreePorts(2)
	if err != nil {
		return err
	}
	if err := writeFile(n.kubeProxyConfigPath(), n.kubeProxyConfig(kubeconfig, ports[0], ports[1])); err != nil {
		return err
	}
	n.kubeProxy, err = framework.StartDaemon("kube-proxy", filepath.Join(n.Root, "log"), nil,
		filepath.Join(n.assets, "kube-proxy"), "--config", n.kubeProxyConfigPath(), "--v", "2")
	if err != nil {
		return err
	}
	client := &http.Client{Timeout: 5 * time.Second}
	return framework.Poll(ctx, 2*time.Minute, func() (bool, error) {
		if err := n.kubeProxy.Exited(); err != nil {
			return false, err
		}
		resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", ports[0]))
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

// claimHostNetwork makes sure no other kube-proxy programs this host, and
// removes what a node of this suite that was killed before its cleanup left:
// its bridge, and with it kube-proxy's table.
func (n *Node) claimHostNetwork() error {
	leftover := bridgeExists(n.cp.Network.Bridge)
	if !leftover && kubeProxyTableExists() {
		return errors.New("another kube-proxy programs this host (its nftables table kube-proxy exists); the cluster suite needs a host of its own")
	}
	if leftover {
		return n.cleanupNetwork()
	}
	return nil
}

func kubeProxyTableExists() bool {
	for _, family := range []string{"ip", "ip6"} {
		if exec.Command("nft", "list", "table", family, "kube-proxy").Run() == nil {
			return true
		}
	}
	return false
}

// cleanupNetwork removes what kube-proxy and the bridge plugin left in the
// host's network: kube-proxy's nftables table and the pods' bridge.
func (n *Node) cleanupNetwork() error {
	if n.cp.Network == nil {
		return nil
	}
	var msgs []string
	if out, err := exec.Command(filepath.Join(n.assets, "kube-proxy"), "--cleanup").CombinedOutput(); err != nil {
		msgs = append(msgs, fmt.Sprintf("kube-proxy --cleanup: %v\n%s", err, out))
	}
	if out, err := exec.Command("ip", "link", "delete", n.cp.Network.Bridge).CombinedOutput(); err != nil && bridgeExists(n.cp.Network.Bridge) {
		msgs = append(msgs, fmt.Sprintf("deleting bridge %s: %v\n%s", n.cp.Network.Bridge, err, out))
	}
	if len(msgs) > 0 {
		return fmt.Errorf("cleaning the node's network: %v", msgs)
	}
	return nil
}

func bridgeExists(name string) bool {
	return exec.Command("ip", "link", "show", name).Run() == nil
}
