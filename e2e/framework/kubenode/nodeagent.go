package kubenode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gpuguard/gpuguard/e2e/framework"
)

// startAgent runs the agent on the mock GPUs with its device plugin on,
// reading the node's own toolkit and containerd configs, with the profile's
// strategy. CDI strategies name devices from the harness's spec (the
// toolkit's kind), or with OwnCDISpec from the spec the agent writes itself
// into the node's CDI directory, for the fake device nodes.
func (n *Node) startAgent(p NodeProfile) error {
	cdi := []string{"--cdi-spec", "toolkit"}
	if p.OwnCDISpec {
		cdi = []string{"--cdi-spec", "own", "--cdi-spec-dir", n.cdiDir(), "--cdi-dev-root", n.Root}
	}
	backend := "mock:" + MockSystem
	if p.MIG {
		backend = MockMIGBackend
	}
	args := append([]string{"--backend", backend, "--node-name", n.Name, "--device-plugin", "on",
		"--device-plugin-dir", n.DevicePluginDir(), "--device-list-strategy", p.Strategy,
		"--toolkit-config", n.toolkitConfigPath(), "--containerd-config", n.containerdConfigPath(),
		"--toolkit-version", n.toolkitVersion,
		"--metrics-addr", fmt.Sprintf("127.0.0.1:%d", n.agentMetricsPort), "--retry-interval", "2s"}, cdi...)
	if p.SharedReplicas > 1 {
		args = append(args, "--time-slicing-replicas", strconv.Itoa(p.SharedReplicas), "--time-slicing-rename")
	}
	verifyArgs, err := n.verifyArgs(p)
	if err != nil {
		return err
	}
	if p.Enforce && os.Getenv(WithoutGPUGuardEnv) != "1" {
		// The enforcer writes its void CDI device where containerd reads specs.
		verifyArgs = append(verifyArgs, "--enforce", "--nri-socket", n.NRISocket(), "--cdi-spec-dir", n.cdiDir())
		if n.agentNamespace != "" {
			verifyArgs = append(verifyArgs, "--enforcer-lease-namespace", n.agentNamespace)
		}
	}
	n.agent, err = framework.StartDaemon("gpuguard-agent", filepath.Join(n.Root, "log"), nil, n.agentBinary, append(args, verifyArgs...)...)
	return err
}

// WithoutGPUGuardEnv, set to 1, runs the node suites without gpuguard: no
// webhook, and no node enforcer in the profiles that ask for one. The
// scenarios that need gpuguard must then fail.
const WithoutGPUGuardEnv = "GPUGUARD_E2E_NODE_WITHOUT_GPUGUARD"

// NRISocket is containerd's NRI socket, under the node's root.
func (n *Node) NRISocket() string { return filepath.Join(n.Root, "run", "nri.sock") }

// enforcerRegistrations counts the node enforcer's registrations with
// containerd's NRI so far (the agent's log is appended to across restarts).
func (n *Node) enforcerRegistrations() int {
	return strings.Count(n.AgentLog(), "node enforcer registered with the runtime")
}

// waitEnforcer waits until the agent's node enforcer has registered with
// containerd's NRI again since before registrations, when the profile runs
// it.
func (n *Node) waitEnforcer(ctx context.Context, p NodeProfile, before int) error {
	if !p.Enforce || os.Getenv(WithoutGPUGuardEnv) == "1" {
		return nil
	}
	err := framework.Poll(ctx, time.Minute, func() (bool, error) {
		if err := n.agent.Exited(); err != nil {
			return false, err
		}
		return n.enforcerRegistrations() > before, nil
	})
	if err != nil {
		return fmt.Errorf("node enforcer: %w\n%s", err, framework.Tail(n.agent.Log))
	}
	return nil
}

// VerifyModeEnv overrides the agent's --verify in every profile.
const VerifyModeEnv = "GPUGUARD_E2E_NODE_VERIFY"

// verifyArgs point the agent's verifier at the node's containerd and
// kubelet, with API access for Events and evictions, looking every two
// seconds.
func (n *Node) verifyArgs(p NodeProfile) ([]string, error) {
	mode := p.Verify
	if mode == "" {
		mode = "report"
	}
	// Set to off, the verifier's scenarios must fail: the suite shows so.
	if forced := os.Getenv(VerifyModeEnv); forced != "" {
		mode = forced
	}
	kubeconfig, err := n.cp.Kubeconfig("gpuguard-agent-" + n.Name)
	if err != nil {
		return nil, err
	}
	return []string{"--verify", mode, "--verify-interval", "2s", "--cri-endpoint", n.ContainerdSocket(),
		"--pod-resources-socket", n.PodResourcesSocket(), "--kubeconfig", kubeconfig, "--reports"}, nil
}

// PodResourcesSocket is the kubelet's PodResources socket, under its --root-dir.
func (n *Node) PodResourcesSocket() string {
	return filepath.Join(n.Root, "kubelet", "pod-resources", "kubelet.sock")
}

// AgentLog is the agent's log so far.
func (n *Node) AgentLog() string {
	if n.agent == nil {
		return ""
	}
	data, _ := os.ReadFile(n.agent.Log)
	return string(data)
}

// AgentLogTail is the end of the agent's log, for failure messages.
func (n *Node) AgentLogTail() string {
	if n.agent == nil {
		return "(no agent running)"
	}
	return framework.Tail(n.agent.Log)
}

// registrations counts the agent's successful registrations so far.
func (n *Node) registrations() int {
	if n.agent == nil {
		return 0
	}
	data, _ := os.ReadFile(n.agent.Log)
	return strings.Count(string(data), "registered with the kubelet")
}

// waitRegistered waits until the agent has registered again since before
// registrations, then until the kubelet offers every GPU.
func (n *Node) waitRegistered(ctx context.Context, before int) error {
	err := framework.Poll(ctx, 2*time.Minute, func() (bool, error) {
		if err := n.agent.Exited(); err != nil {
			return false, err
		}
		return n.registrations() > before, nil
	})
	if err != nil {
		return fmt.Errorf("agent registration: %w\n%s", err, framework.Tail(n.agent.Log))
	}
	return n.waitAllocatable(ctx, time.Now())
}

// AgentMetrics returns the agent's metrics: sample name with labels, as
// exposed, to value.
func (n *Node) AgentMetrics(ctx context.Context) (map[string]float64, error) {
	return framework.Scrape(ctx, fmt.Sprintf("http://127.0.0.1:%d/metrics", n.agentMetricsPort))
}

// ChartAgentArgs are the extra arguments the chart's agent DaemonSet needs
// on this node (agent.extraArgs): the mock backend, since no NVIDIA driver
// is here; the node's toolkit and containerd configs, which live under its
// root rather than /etc; the toolkit's version, since nvidia-ctk is not
// installed; the verifier's sockets; and quick retries, for a test.
func (n *Node) ChartAgentArgs() []string {
	return []string{"--backend=mock:" + MockSystem, "--toolkit-config=" + n.toolkitConfigPath(),
		"--containerd-config=" + n.containerdConfigPath(), "--toolkit-version=" + n.toolkitVersion,
		"--retry-interval=2s",
		// The verifier's sockets, which live under the node's root here,
		// seen through the chart's read-only host mount; a quicker look.
		"--cri-endpoint=/host" + n.ContainerdSocket(), "--pod-resources-socket=/host" + n.PodResourcesSocket(),
		"--verify-interval=2s"}
}

// CDIDir is the node's CDI spec directory, which containerd and the NVIDIA
// runtime read.
func (n *Node) CDIDir() string { return n.cdiDir() }
