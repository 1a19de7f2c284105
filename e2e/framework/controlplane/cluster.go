package controlplane

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/gpuguard/gpuguard/e2e/framework"
	"github.com/gpuguard/gpuguard/testsupport/testcerts"
)

// ClusterBinaries are the programs of a whole cluster, built by
// hack/build-upstream.sh with CLUSTER=1 into the assets directory;
// clusterHostTools come from the system (hack/build-node.sh installs them).
var (
	ClusterBinaries = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
		"kube-proxy", "kubectl", "helm", "cni/bridge", "cni/host-local", "cni/loopback"}
	clusterHostTools = []string{"nft", "ip"}
)

// ClusterNetwork is how pods and services are wired: pods on a bridge with
// addresses from PodCIDR, services on ServiceCIDR through kube-proxy, and the
// API server advertised on NodeIP, where pods reach it.
type ClusterNetwork struct {
	NodeIP      net.IP
	PodCIDR     string
	ServiceCIDR string
	// KubernetesServiceIP is the first address of ServiceCIDR, the
	// `kubernetes` Service that in-cluster clients dial.
	KubernetesServiceIP net.IP
	// Bridge is the host's bridge for the pods.
	Bridge string
}

// The suite's address ranges; chosen away from the host's networks, which
// StartClusterControlPlane checks.
var defaultClusterNetwork = ClusterNetwork{
	PodCIDR: "10.244.0.0/24", ServiceCIDR: "10.96.0.0/16",
	KubernetesServiceIP: net.ParseIP("10.96.0.1"), Bridge: "gpuguard-br0",
}

// CheckClusterBinaries fails when a program of the cluster is missing.
func CheckClusterBinaries(assets string) error {
	for _, b := range ClusterBinaries {
		if _, err := os.Stat(filepath.Join(assets, b)); err != nil {
			return fmt.Errorf("%s not found in %s: run CLUSTER=1 hack/build-upstream.sh (make e2e does)", b, assets)
		}
	}
	for _, tool := range clusterHostTools {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found: hack/install-deps.sh installs it from Debian's packages", tool)
		}
	}
	return nil
}

// clusterPKI is the cluster's certificate authority and the files issued by it.
type clusterPKI struct {
	ca  *testcerts.CA
	dir string
}

func (p clusterPKI) path(name string) string { return filepath.Join(p.dir, name) }

// controlPlaneProcesses are a whole cluster's control-plane daemons, in
// start order.
type controlPlaneProcesses struct {
	logDir  string
	daemons []*framework.Daemon
}

func (c *controlPlaneProcesses) start(name, bin string, args ...string) (*framework.Daemon, error) {
	d, err := framework.StartDaemon(name, c.logDir, nil, bin, args...)
	if err != nil {
		return nil, err
	}
	c.daemons = append(c.daemons, d)
	return d, nil
}

// stop stops the daemons in reverse start order.
func (c *controlPlaneProcesses) stop() error {
	var errs []error
	for i := len(c.daemons) - 1; i >= 0; i-- {
		errs = append(errs, c.daemons[i].Stop(30*time.Second))
	}
	c.daemons = nil
	return errors.Join(errs...)
}

// stopNamed stops the named daemons and forgets them.
func (c *controlPlaneProcesses) stopNamed(names ...string) error {
	var errs []error
	kept := c.daemons[:0]
	for _, d := range c.daemons {
		if slices.Contains(names, d.Name) {
			errs = append(errs, d.Stop(30*time.Second))
			continue
		}
		kept = append(kept, d)
	}
	c.daemons = kept
	return errors.Join(errs...)
}

// restart stops the named daemon and starts it again with the same
// command, in the same place of the start order.
func (c *controlPlaneProcesses) restart(name string) (*framework.Daemon, error) {
	i := slices.IndexFunc(c.daemons, func(d *framework.Daemon) bool { return d.Name == name })
	if i < 0 {
		return nil, fmt.Errorf("no %s runs", name)
	}
	old := c.daemons[i]
	if err := old.Stop(30 * time.Second); err != nil {
		return nil, err
	}
	bin, args := old.Command()
	d, err := framework.StartDaemon(name, c.logDir, nil, bin, args...)
	if err != nil {
		return nil, err
	}
	c.daemons[i] = d
	return d, nil
}

// StartClusterControlPlane starts etcd, kube-apiserver, kube-controller-manager
// and kube-scheduler the way a kubeadm cluster runs them: one CA, a client
// certificate per component, service account tokens, Node and RBAC
// authorization. The API server is advertised on this machine's address, so
// that pods reach it through the `kubernetes` Service once a node runs
// kube-proxy (StartNode does on such a control plane).
func StartClusterControlPlane(ctx context.Context, assets string) (*ControlPlane, error) {
	if err := CheckClusterBinaries(assets); err != nil {
		return nil, err
	}
	network := defaultClusterNetwork
	ip, err := hostIP(network)
	if err != nil {
		return nil, err
	}
	network.NodeIP = ip
	dir, err := os.MkdirTemp("", "gpuguard-cluster-")
	if err != nil {
		return nil, err
	}
	procs := &controlPlaneProcesses{logDir: filepath.Join(dir, "log")}
	cp := &ControlPlane{dir: dir, nodeAuthorizer: true, Network: &network, logs: procs.logDir,
		ClientCAFile: filepath.Join(dir, "pki", "ca.crt")}
	cp.stop = procs.stop
	cp.stopControllers = func() error { return procs.stopNamed("kube-controller-manager", "kube-scheduler") }
	cp.restartAPIServer = func(ctx context.Context) error {
		apiserver, err := procs.restart("kube-apiserver")
		if err != nil {
			return err
		}
		return cp.waitReady(ctx, apiserver)
	}
	if err := cp.startCluster(ctx, assets, procs); err != nil {
		return nil, errors.Join(fmt.Errorf("%w\n%s", err, cp.LogTails()), cp.Stop())
	}
	return cp, nil
}

func (cp *ControlPlane) startCluster(ctx context.Context, assets string, procs *controlPlaneProcesses) error {
	pki, err := newClusterPKI(filepath.Join(cp.dir, "pki"), *cp.Network)
	if err != nil {
		return err
	}
	ports, err := framework.FreePorts(5)
	if err != nil {
		return err
	}
	etcdURL := fmt.Sprintf("https://127.0.0.1:%d", ports[0])
	server := fmt.Sprintf("https://127.0.0.1:%d", ports[2])
	cp.kubeconfig = pki.kubeconfig(server)
	if err := os.MkdirAll(procs.logDir, 0o755); err != nil {
		return err
	}
	if err := startEtcd(procs, assets, pki, filepath.Join(cp.dir, "etcd"), etcdURL, ports[1]); err != nil {
		return err
	}
	apiserver, err := procs.start("kube-apiserver", filepath.Join(assets, "kube-apiserver"),
		apiserverArgs(pki, *cp.Network, etcdURL, ports[2])...)
	if err != nil {
		return err
	}
	if err := cp.connect(ctx, apiserver); err != nil {
		return err
	}
	if err := cp.startControllers(procs, assets, pki, ports[3], ports[4]); err != nil {
		return err
	}
	return cp.waitControllers(ctx, procs)
}

func newClusterPKI(dir string, network ClusterNetwork) (clusterPKI, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return clusterPKI{}, err
	}
	ca, err := testcerts.NewCA()
	if err != nil {
		return clusterPKI{}, err
	}
	p := clusterPKI{ca: ca, dir: dir}
	if err := ca.WriteKeyPair(p.path("ca.crt"), p.path("ca.key")); err != nil {
		return p, err
	}
	serving := testcerts.Leaf{
		CommonName: "kube-apiserver", Server: true,
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		IPs:      []net.IP{net.ParseIP("127.0.0.1"), network.NodeIP, network.KubernetesServiceIP},
	}
	if err := ca.WriteLeaf(p.path("apiserver.crt"), p.path("apiserver.key"), serving); err != nil {
		return p, err
	}
	// etcd's serving and peer certificate, and the API server's client one.
	etcd := testcerts.Leaf{CommonName: "etcd", DNSNames: []string{"localhost"}, IPs: []net.IP{net.ParseIP("127.0.0.1")}, Server: true, Client: true}
	if err := ca.WriteLeaf(p.path("etcd.crt"), p.path("etcd.key"), etcd); err != nil {
		return p, err
	}
	etcdClient := testcerts.Leaf{CommonName: "kube-apiserver-etcd-client", Client: true}
	if err := ca.WriteLeaf(p.path("apiserver-etcd-client.crt"), p.path("apiserver-etcd-client.key"), etcdClient); err != nil {
		return p, err
	}
	kubeletClient := testcerts.Leaf{CommonName: "kube-apiserver-kubelet-client", Organizations: []string{"system:masters"}, Client: true}
	if err := ca.WriteLeaf(p.path("apiserver-kubelet-client.crt"), p.path("apiserver-kubelet-client.key"), kubeletClient); err != nil {
		return p, err
	}
	// Signs service account tokens; the API server verifies with the same file.
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return p, err
	}
	return p, testcerts.WriteKey(p.path("sa.key"), saKey)
}

// kubeconfig returns a function that issues a client certificate for a user
// in groups and returns a kubeconfig with it, for server.
func (p clusterPKI) kubeconfig(server string) func(user string, groups ...string) ([]byte, error) {
	return func(user string, groups ...string) ([]byte, error) {
		base := strings.ReplaceAll(user, ":", "-")
		crt, key := p.path(base+".crt"), p.path(base+".key")
		if err := p.ca.WriteLeaf(crt, key, testcerts.Leaf{CommonName: user, Organizations: groups, Client: true}); err != nil {
			return nil, err
		}
		cfg := clientcmdapi.NewConfig()
		cfg.Clusters["e2e"] = &clientcmdapi.Cluster{Server: server, CertificateAuthority: p.path("ca.crt")}
		cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificate: crt, ClientKey: key}
		cfg.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: user}
		cfg.CurrentContext = "e2e"
		return clientcmd.Write(*cfg)
	}
}

// startEtcd starts etcd on loopback with TLS and client certificates on
// both its ports, as kubeadm does: anyone who can write etcd owns the cluster.
func startEtcd(procs *controlPlaneProcesses, assets string, pki clusterPKI, dataDir, clientURL string, peerPort int) error {
	peerURL := fmt.Sprintf("https://127.0.0.1:%d", peerPort)
	_, err := procs.start("etcd", filepath.Join(assets, "etcd"),
		"--name", "e2e", "--data-dir", dataDir,
		"--listen-client-urls", clientURL, "--advertise-client-urls", clientURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "e2e="+peerURL,
		"--cert-file", pki.path("etcd.crt"), "--key-file", pki.path("etcd.key"),
		"--client-cert-auth", "--trusted-ca-file", pki.path("ca.crt"),
		"--peer-cert-file", pki.path("etcd.crt"), "--peer-key-file", pki.path("etcd.key"),
		"--peer-client-cert-auth", "--peer-trusted-ca-file", pki.path("ca.crt"),
		// A test cluster's data need not survive a power cut.
		"--unsafe-no-fsync")
	return err
}

func apiserverArgs(pki clusterPKI, network ClusterNetwork, etcdURL string, port int) []string {
	return []string{
		"--etcd-servers", etcdURL,
		"--etcd-cafile", pki.path("ca.crt"),
		"--etcd-certfile", pki.path("apiserver-etcd-client.crt"), "--etcd-keyfile", pki.path("apiserver-etcd-client.key"),
		"--bind-address", "0.0.0.0", "--secure-port", strconv.Itoa(port),
		"--advertise-address", network.NodeIP.String(),
		"--tls-cert-file", pki.path("apiserver.crt"), "--tls-private-key-file", pki.path("apiserver.key"),
		"--client-ca-file", pki.path("ca.crt"),
		"--kubelet-client-certificate", pki.path("apiserver-kubelet-client.crt"),
		"--kubelet-client-key", pki.path("apiserver-kubelet-client.key"),
		// kubectl logs and exec reach the kubelet on the node's address.
		"--kubelet-preferred-address-types", "InternalIP",
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", pki.path("sa.key"),
		"--service-account-signing-key-file", pki.path("sa.key"),
		"--service-cluster-ip-range", network.ServiceCIDR,
		"--authorization-mode", "Node,RBAC",
		"--enable-admission-plugins", "NodeRestriction",
		// The chart's agent DaemonSet is privileged, as a GPU node agent is.
		"--allow-privileged",
		"--profiling=false",
	}
}

// connect waits until the API server is ready and makes the administrator's
// client.
func (cp *ControlPlane) connect(ctx context.Context, apiserver *framework.Daemon) error {
	data, err := cp.kubeconfig("e2e-admin", "system:masters")
	if err != nil {
		return err
	}
	if cp.Config, err = clientcmd.RESTConfigFromKubeConfig(data); err != nil {
		return err
	}
	cp.Config.WarningHandler = rest.NoWarnings{}
	if cp.Client, err = kubernetes.NewForConfig(cp.Config); err != nil {
		return err
	}
	return cp.waitReady(ctx, apiserver)
}

// waitReady waits until the API server says it is ready.
func (cp *ControlPlane) waitReady(ctx context.Context, apiserver *framework.Daemon) error {
	return framework.Poll(ctx, 3*time.Minute, func() (bool, error) {
		if err := apiserver.Exited(); err != nil {
			return false, err
		}
		body, err := cp.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && string(body) == "ok", nil
	})
}

// startControllers starts the controller manager and the scheduler, each with
// the identity the bootstrap RBAC policy grants its permissions to.
func (cp *ControlPlane) startControllers(procs *controlPlaneProcesses, assets string, pki clusterPKI, cmPort, schedPort int) error {
	cmConfig, err := cp.KubeconfigFor("system:kube-controller-manager")
	if err != nil {
		return err
	}
	_, err = procs.start("kube-controller-manager", filepath.Join(assets, "kube-controller-manager"),
		"--kubeconfig", cmConfig, "--authentication-kubeconfig", cmConfig, "--authorization-kubeconfig", cmConfig,
		"--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(cmPort),
		"--leader-elect=false", "--use-service-account-credentials",
		"--root-ca-file", pki.path("ca.crt"), "--service-account-private-key-file", pki.path("sa.key"),
		"--cluster-signing-cert-file", pki.path("ca.crt"), "--cluster-signing-key-file", pki.path("ca.key"))
	if err != nil {
		return err
	}
	schedConfig, err := cp.KubeconfigFor("system:kube-scheduler")
	if err != nil {
		return err
	}
	_, err = procs.start("kube-scheduler", filepath.Join(assets, "kube-scheduler"),
		"--kubeconfig", schedConfig, "--authentication-kubeconfig", schedConfig, "--authorization-kubeconfig", schedConfig,
		"--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(schedPort), "--leader-elect=false")
	return err
}

// waitControllers waits for what the controller manager makes first in every
// cluster: the default service account and the root CA ConfigMap that pods
// mount with their token.
func (cp *ControlPlane) waitControllers(ctx context.Context, procs *controlPlaneProcesses) error {
	return framework.Poll(ctx, 2*time.Minute, func() (bool, error) {
		for _, d := range procs.daemons {
			if err := d.Exited(); err != nil {
				return false, err
			}
		}
		_, saErr := cp.Client.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{})
		_, caErr := cp.Client.CoreV1().ConfigMaps(metav1.NamespaceDefault).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return saErr == nil && caErr == nil, nil
	})
}

// LogTails is the end of every control-plane log, for failure messages
// (none for envtest's, which keeps no logs).
func (cp *ControlPlane) LogTails() string {
	if cp.logs == "" {
		return ""
	}
	logs, _ := filepath.Glob(filepath.Join(cp.logs, "*.log"))
	var b strings.Builder
	for _, l := range logs {
		fmt.Fprintf(&b, "==> %s <==\n%s\n", filepath.Base(l), framework.Tail(l))
	}
	return b.String()
}

// hostIP is the first global IPv4 address of an interface that is up (not
// loopback, not the pods' bridge): the address a node advertises. Its
// network must not overlap the cluster's ranges.
func hostIP(network ClusterNetwork) (net.IP, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	_, pods, _ := net.ParseCIDR(network.PodCIDR)
	_, services, _ := net.ParseCIDR(network.ServiceCIDR)
	for _, iface := range ifaces {
		if iface.Flags&net.FlagUp == 0 || iface.Flags&net.FlagLoopback != 0 || iface.Name == network.Bridge {
			continue
		}
		addrs, _ := iface.Addrs()
		for _, a := range addrs {
			ipnet, ok := a.(*net.IPNet)
			if !ok || ipnet.IP.To4() == nil || !ipnet.IP.IsGlobalUnicast() {
				continue
			}
			if ipnet.Contains(pods.IP) || ipnet.Contains(services.IP) || pods.Contains(ipnet.IP) || services.Contains(ipnet.IP) {
				return nil, fmt.Errorf("%s's network %s overlaps the cluster's pods (%s) or services (%s)", iface.Name, ipnet, network.PodCIDR, network.ServiceCIDR)
			}
			return ipnet.IP, nil
		}
	}
	return nil, errors.New("no IPv4 address on an interface that is up: the API server needs one to advertise to pods")
}

// WaitNodeReady waits until the node reports Ready: on a cluster, its
// runtime's network (CNI) is up.
func (cp *ControlPlane) WaitNodeReady(ctx context.Context, name string) error {
	return framework.Poll(ctx, 2*time.Minute, func() (bool, error) {
		node, err := cp.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	})
}
