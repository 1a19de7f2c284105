package kubenode

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuguard/gpuguard/e2e/framework"
	"github.com/gpuguard/gpuguard/e2e/framework/controlplane"
)

// NodeBinaries are the node stack's programs, built by hack/build-node.sh
// into the assets directory (runc comes from the system).
var NodeBinaries = []string{"kubelet", "containerd", "containerd-shim-runc-v2", "ctr", "nvidia-container-runtime"}

// Node is a real node on this machine: containerd with the NVIDIA Container
// Runtime, a kubelet registered with the control plane, fake GPUs, and
// gpuguard's agent serving them as a device plugin. Everything lives under
// Root, a temporary directory.
type Node struct {
	Name string
	Root string
	GPUs []FakeGPU
	// MIGs are the MIG devices of the agent's backend in profiles with MIG.
	MIGs []FakeMIG

	cp       *controlplane.ControlPlane
	repoRoot string
	assets   string
	// ToolkitVersion is given to the agent, which cannot run nvidia-ctk here.
	toolkitVersion string
	// agentNamespace: NodeOptions.AgentNamespace.
	agentNamespace string
	// restrictOOMScoreAdj is set where this process cannot lower
	// oom_score_adj (no CAP_SYS_RESOURCE, as in unprivileged containers).
	restrictOOMScoreAdj bool
	// createdHostKubeletDir: /var/lib/kubelet did not exist before the node.
	createdHostKubeletDir bool
	// claimedDevicePluginDir: no other kubelet served the device plugin
	// directory when the node started, so what is in it is the node's.
	claimedDevicePluginDir bool

	kubeletPort, kubeletHealthzPort, agentMetricsPort int
	agentBinary                                       string
	kubeconfig                                        string
	profile                                           *NodeProfile

	containerd, kubelet, agent, kubeProxy *framework.Daemon
	// noopNRI, when running, is the node benchmark's reference NRI plugin.
	noopNRI       *framework.Daemon
	noopNRIBinary string
	// savedSysctls are the host's values of what the kubelet and the bridge
	// plugin change, restored by Stop.
	savedSysctls map[string]string
	stopOnce     sync.Once
	stopErr      error
}

// NodeOptions say where things are.
type NodeOptions struct {
	Name           string
	RepoRoot       string
	Assets         string // hack/build-node.sh's output, _output/bin
	ToolkitVersion string
	// AgentNamespace is where the agent's node enforcer holds its Lease, as
	// the chart's agent does in the release namespace; empty holds none.
	AgentNamespace string
}

// NodeReadiness says why this machine cannot run a node, or nil.
func NodeReadiness() error {
	if os.Geteuid() != 0 {
		return errors.New("not root (containerd, runc and mknod need it)")
	}
	dir, err := os.MkdirTemp("", "gpuguard-mknod-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := MknodAllowed(dir); err != nil {
		return fmt.Errorf("mknod is not allowed here: %v", err)
	}
	// A kubelet already running is no reason to skip: the suite would pass
	// having tested nothing. StartNode fails on it instead.
	return nil
}

// CheckNodeBinaries fails when a program of the node stack is missing.
func CheckNodeBinaries(assets string) error {
	for _, b := range NodeBinaries {
		if _, err := os.Stat(filepath.Join(assets, b)); err != nil {
			return fmt.Errorf("%s not found in %s: run hack/build-node.sh (make e2e does)", b, assets)
		}
	}
	if _, err := exec.LookPath("runc"); err != nil {
		return errors.New("runc not found: hack/install-deps.sh installs it from Debian's packages")
	}
	return nil
}

// StartNode prepares the fake GPUs and the images and starts containerd and
// the kubelet. The agent starts with the first Apply.
func StartNode(ctx context.Context, cp *controlplane.ControlPlane, opts NodeOptions) (*Node, error) {
	root, err := os.MkdirTemp("", "gpuguard-node-")
	if err != nil {
		return nil, err
	}
	n := &Node{Name: opts.Name, Root: root, cp: cp, repoRoot: opts.RepoRoot, assets: opts.Assets,
		toolkitVersion: opts.ToolkitVersion, agentNamespace: opts.AgentNamespace, restrictOOMScoreAdj: !HasCapability(capSysResource)}
	if err := n.start(ctx); err != nil {
		return nil, errors.Join(err, n.Stop(context.Background()))
	}
	return n, nil
}

func (n *Node) start(ctx context.Context) error {
	ports, err := framework.FreePorts(3)
	if err != nil {
		return err
	}
	n.kubeletPort, n.kubeletHealthzPort, n.agentMetricsPort = ports[0], ports[1], ports[2]
	if err := os.MkdirAll(filepath.Join(n.Root, "log"), 0o755); err != nil {
		return err
	}
	// The way to containerd's socket is open to every user, as /run and
	// /run/containerd (0711) are on a node: the socket's own mode (root:root
	// 0660) is what keeps pods out, which the suite shows.
	if err := os.Chmod(n.Root, 0o711); err != nil {
		return err
	}
	if err := os.Mkdir(filepath.Join(n.Root, "run"), 0o711); err != nil {
		return err
	}
	if n.agentBinary, err = framework.BuildAgent(n.repoRoot, n.Root); err != nil {
		return err
	}
	if err := n.claimDevicePluginDir(); err != nil {
		return err
	}
	gpus, err := MockGPUs(ctx, n.agentBinary, n.Name, n.DevicePluginDir())
	if err != nil {
		return err
	}
	if n.GPUs, err = MakeFakeGPUs(filepath.Join(n.Root, "dev"), gpus); err != nil {
		return err
	}
	if n.MIGs, err = MockMIGs(ctx, n.agentBinary, n.Name, n.DevicePluginDir(), n.GPUs); err != nil {
		return err
	}
	if err := WriteCDISpec(n.cdiDir(), filepath.Join(n.Root, "dev"), n.GPUs, n.MIGs); err != nil {
		return err
	}
	images, err := BuildImages(n.repoRoot, n.Root)
	if err != nil {
		return err
	}
	n.profile = &NodeProfile{Strategy: "envvar"}
	if err := n.writeConfigs(*n.profile); err != nil {
		return err
	}
	if err := n.writeCNIConfig(); err != nil {
		return err
	}
	if err := n.startContainerd(ctx); err != nil {
		return err
	}
	if err := n.ImportImages(ctx, images); err != nil {
		return err
	}
	if n.savedSysctls, err = saveSysctls(n.cp.Network != nil); err != nil {
		return err
	}
	if err := n.StartKubelet(ctx); err != nil {
		return err
	}
	if n.cp.Network == nil {
		return nil
	}
	if err := n.startKubeProxy(ctx); err != nil {
		return err
	}
	return n.cp.WaitNodeReady(ctx, n.Name)
}

func (n *Node) cdiDir() string { return filepath.Join(n.Root, "cdi") }
func (n *Node) toolkitConfigPath() string {
	return filepath.Join(n.Root, "etc", "nvidia-container-runtime", "config.toml")
}
func (n *Node) containerdConfigPath() string {
	return filepath.Join(n.Root, "etc", "containerd", "config.toml")
}

// ContainerdSocket is containerd's CRI and API endpoint.
func (n *Node) ContainerdSocket() string { return filepath.Join(n.Root, "run", "containerd.sock") }

// hostKubeletDir holds the kubelet's device plugin directory whatever its
// --root-dir: the kubelet's registration socket path is a constant of the
// device plugin API. So the node shares it with the host, and only one node
// (and no other kubelet) can run on a machine.
const hostKubeletDir = "/var/lib/kubelet"

// DevicePluginDir is the kubelet's device plugin directory.
func (n *Node) DevicePluginDir() string { return filepath.Join(hostKubeletDir, "device-plugins") }

// claimDevicePluginDir makes sure no other kubelet serves the device plugin
// directory and remembers what to clean up.
func (n *Node) claimDevicePluginDir() error {
	if err := otherKubelet(); err != nil {
		return err
	}
	n.claimedDevicePluginDir = true
	if _, err := os.Stat(hostKubeletDir); os.IsNotExist(err) {
		n.createdHostKubeletDir = true
	}
	return os.MkdirAll(n.DevicePluginDir(), 0o755)
}

// otherKubelet fails when a kubelet listens on the device plugin socket.
func otherKubelet() error {
	sock := filepath.Join(hostKubeletDir, "device-plugins", "kubelet.sock")
	if c, err := net.DialTimeout("unix", sock, time.Second); err == nil {
		c.Close()
		return fmt.Errorf("a kubelet already serves %s on this machine", sock)
	}
	return nil
}

// releaseDevicePluginDir removes what the node left in the host's kubelet
// directory: all of it when the node created it, else the node's sockets
// and the device checkpoint.
func (n *Node) releaseDevicePluginDir() error {
	if !n.claimedDevicePluginDir {
		// Another kubelet's: a start refused for it must not remove its
		// sockets (it once did, and broke the other suite's registrations).
		return nil
	}
	if n.createdHostKubeletDir {
		return os.RemoveAll(hostKubeletDir)
	}
	leftovers, _ := filepath.Glob(filepath.Join(n.DevicePluginDir(), "gpuguard-*.sock"))
	leftovers = append(leftovers, filepath.Join(n.DevicePluginDir(), "kubelet.sock"), filepath.Join(n.DevicePluginDir(), "kubelet_internal_checkpoint"))
	for _, f := range leftovers {
		_ = os.Remove(f)
	}
	return nil
}

// Logs are the paths of the node's logs, for failure messages.
func (n *Node) Logs() []string {
	logs, _ := filepath.Glob(filepath.Join(n.Root, "log", "*.log"))
	return logs
}

// LogTails is the end of every node log, for failure messages.
func (n *Node) LogTails() string {
	var b strings.Builder
	for _, l := range n.Logs() {
		fmt.Fprintf(&b, "==> %s <==\n%s\n", filepath.Base(l), framework.Tail(l))
	}
	return b.String()
}

func (n *Node) writeConfigs(p NodeProfile) error {
	if err := writeFile(n.toolkitConfigPath(), n.toolkitConfig(p)); err != nil {
		return err
	}
	return writeFile(n.containerdConfigPath(), n.containerdConfig(p))
}

// Apply configures the node for a scenario: it rewrites the toolkit's and
// containerd's configs, restarts containerd when its config changed, and
// restarts the agent with the profile's strategy, waiting until the kubelet
// can allocate GPUs again.
func (n *Node) Apply(ctx context.Context, p NodeProfile) error {
	restartContainerd := n.profile.containerdKey() != p.containerdKey()
	if err := n.writeConfigs(p); err != nil {
		return err
	}
	if restartContainerd {
		if err := n.containerd.Stop(30 * time.Second); err != nil {
			return err
		}
		if err := n.startContainerd(ctx); err != nil {
			return err
		}
	}
	before, enforcers := n.registrations(), n.enforcerRegistrations()
	if err := n.agent.Stop(30 * time.Second); err != nil {
		return err
	}
	if err := n.startAgent(p); err != nil {
		return err
	}
	n.profile = &p
	if err := n.waitRegistered(ctx, before); err != nil {
		return err
	}
	return n.waitEnforcer(ctx, p, enforcers)
}

// StopAgent stops the agent, and with it the node enforcer and the
// verifier, until StartAgent.
func (n *Node) StopAgent() error { return n.agent.Stop(30 * time.Second) }

// KillAgent kills the agent with SIGKILL, as an OOM kill does: the node
// enforcer releases nothing, its Lease stays held until it goes stale.
// StartAgent starts it again.
func (n *Node) KillAgent() error { return n.agent.Kill() }

// FreezeAgent stops the agent's process (SIGSTOP) until ThawAgent: the
// enforcer neither answers the runtime nor connects to it again, as in the
// seconds after containerd restarts before it has reconnected.
func (n *Node) FreezeAgent() error { return n.agent.Freeze() }

// ThawAgent lets a frozen agent run again and waits until, where the
// profile runs it, the node enforcer has registered with containerd again
// (having lost its connection while frozen, if containerd restarted).
func (n *Node) ThawAgent(ctx context.Context) error {
	enforcers := n.enforcerRegistrations()
	if err := n.agent.Thaw(); err != nil {
		return err
	}
	return n.waitEnforcer(ctx, *n.profile, enforcers)
}

// RestartContainerd stops containerd and starts it again with the same
// configuration; the containers it ran keep running under their shims.
func (n *Node) RestartContainerd(ctx context.Context) error {
	if err := n.containerd.Stop(30 * time.Second); err != nil {
		return err
	}
	return n.startContainerd(ctx)
}

// StartAgent starts the agent again with the node's profile and waits
// until it serves the kubelet and, where the profile runs it, the node
// enforcer has registered with containerd.
func (n *Node) StartAgent(ctx context.Context) error {
	before, enforcers := n.registrations(), n.enforcerRegistrations()
	if err := n.startAgent(*n.profile); err != nil {
		return err
	}
	if err := n.waitRegistered(ctx, before); err != nil {
		return err
	}
	return n.waitEnforcer(ctx, *n.profile, enforcers)
}

// EnforcerLeaseHolder is the holder of the node enforcer's Lease ("" when
// released), and whether the Lease exists.
func (n *Node) EnforcerLeaseHolder(ctx context.Context) (string, bool, error) {
	l, err := n.cp.Client.CoordinationV1().Leases(n.agentNamespace).Get(ctx, "gpuguard-enforcer-"+n.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "", false, nil
	case err != nil:
		return "", false, err
	case l.Spec.HolderIdentity == nil:
		return "", true, nil
	}
	return *l.Spec.HolderIdentity, true, nil
}

// Profile is the configuration the node runs with.
func (n *Node) Profile() NodeProfile { return *n.profile }

func (n *Node) startContainerd(ctx context.Context) error {
	env := []string{
		// The runtime reads its config from here rather than from /etc.
		"NVIDIA_CTK_CONFIG_FILE_PATH=" + n.toolkitConfigPath(),
		// containerd finds its shim, and the runtime finds runc, on PATH.
		"PATH=" + n.assets + ":" + os.Getenv("PATH"),
	}
	var err error
	n.containerd, err = framework.StartDaemon("containerd", filepath.Join(n.Root, "log"), env,
		filepath.Join(n.assets, "containerd"), "--config", n.containerdConfigPath())
	if err != nil {
		return err
	}
	return framework.Poll(ctx, time.Minute, func() (bool, error) {
		if err := n.containerd.Exited(); err != nil {
			return false, err
		}
		return n.ctr(ctx, "version") == nil, nil
	})
}

// ctr runs containerd's client against the node's containerd.
func (n *Node) ctr(ctx context.Context, args ...string) error {
	_, err := n.ctrOutput(ctx, args...)
	return err
}

func (n *Node) ctrOutput(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	full := append([]string{"--address", n.ContainerdSocket(), "--namespace", "k8s.io"}, args...)
	cmd := exec.CommandContext(ctx, filepath.Join(n.assets, "ctr"), full...)
	// Only stdout is the answer: ctr also logs warnings (cgroup v1).
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("ctr %s: %w\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out), nil
}

// ImportImages loads the images of a docker-archive tarball, unpacked for
// the CRI's snapshotter, as a registry pull would leave them.
func (n *Node) ImportImages(ctx context.Context, tarball string) error {
	return n.ctr(ctx, "images", "import", "--snapshotter", "native", tarball)
}

// Stop deletes the node's pods, stops its processes, restores what it changed
// on the host and removes its root. Calls after the first return its result.
func (n *Node) Stop(ctx context.Context) error {
	n.stopOnce.Do(func() { n.stopErr = n.stop(ctx) })
	return n.stopErr
}

func (n *Node) stop(ctx context.Context) error {
	var errs []error
	if n.kubelet != nil && n.containerd != nil {
		errs = append(errs, n.drain(ctx))
	}
	for _, d := range []*framework.Daemon{n.noopNRI, n.agent, n.kubeProxy, n.kubelet, n.containerd} {
		errs = append(errs, d.Stop(30*time.Second))
	}
	killShims(n.Root)
	unmountUnder(n.Root)
	errs = append(errs, n.cleanupNetwork(), restoreSysctls(n.savedSysctls), os.RemoveAll(n.Root), n.releaseDevicePluginDir())
	return errors.Join(errs...)
}

// drain deletes every pod of the node and waits until containerd runs no
// more containers, so that no shim outlives the suite.
func (n *Node) drain(ctx context.Context) error {
	if err := n.DeleteAllPods(ctx); err != nil {
		return err
	}
	return framework.Poll(ctx, 2*time.Minute, func() (bool, error) {
		out, err := n.ctrOutput(ctx, "tasks", "ls", "-q")
		return err == nil && strings.TrimSpace(out) == "", nil
	})
}

// capSysResource is CAP_SYS_RESOURCE's bit in the capability sets.
const capSysResource = 24

// HasCapability reports whether capability bit is in this process's
// effective set (/proc/self/status, CapEff).
func HasCapability(bit uint) bool {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if hex, ok := strings.CutPrefix(line, "CapEff:"); ok {
			v, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			return err == nil && v&(1<<bit) != 0
		}
	}
	return false
}
