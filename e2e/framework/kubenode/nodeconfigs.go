package kubenode

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// NodeProfile is how a scenario wants the node configured: the NVIDIA
// Container Toolkit, containerd, and the agent's device-list strategy.
type NodeProfile struct {
	// Hardened turns the toolkit to the configuration gpuguard asks for:
	// the env var is ignored in unprivileged containers and volume-mount
	// device lists are accepted. Otherwise the toolkit keeps its defaults.
	Hardened bool
	// RuncDefault makes plain runc containerd's default handler; otherwise
	// the NVIDIA runtime is the default, as on a typical GPU cluster.
	RuncDefault bool
	// PodAnnotations are passed from pods to the NVIDIA handler's OCI spec
	// (containerd's pod_annotations), e.g. "cdi.k8s.io/*".
	PodAnnotations []string
	// Strategy is the agent's --device-list-strategy.
	Strategy string
	// OwnCDISpec: for CDI strategies the agent writes and names devices from
	// its own spec (kind gpuguard.io/gpu) instead of the toolkit's.
	OwnCDISpec bool
	// Verify is the agent's --verify; "" is its default, report.
	Verify string
	// SharedReplicas, above one, time-slices each GPU into that many shares
	// served as nvidia.com/gpu.shared.
	SharedReplicas int
	// Enforce runs the agent's node enforcer on containerd's NRI socket
	// (which every profile serves), unless WithoutGPUGuardEnv is set.
	Enforce bool
	// RequireEnforcer has containerd's NRI default validator require the
	// enforcer: containers are refused while it is not connected.
	RequireEnforcer bool
	// MIG runs the agent on the MIG backend (GPUs 0 and 1 split into MIG
	// devices, served per profile: nvidia.com/mig-1g.5gb and others).
	MIG bool
}

// String names the profile in logs and tables.
func (p NodeProfile) String() string {
	s := "toolkit defaults"
	if p.Hardened {
		s = "hardened toolkit"
	}
	if len(p.PodAnnotations) > 0 {
		s += ", pod_annotations " + strings.Join(p.PodAnnotations, ",")
	}
	s += ", agent " + p.Strategy
	if p.OwnCDISpec {
		s += " with its own CDI spec"
	}
	if p.SharedReplicas > 1 {
		s += fmt.Sprintf(", %d time-sliced shares per GPU", p.SharedReplicas)
	}
	if p.MIG {
		s += ", MIG on GPUs 0 and 1"
	}
	if p.Enforce {
		s += ", node enforcer"
	}
	if p.RequireEnforcer {
		s += " required by containerd"
	}
	if p.Verify != "" {
		s += ", verifier " + p.Verify
	}
	return s
}

// servedResource is the resource the agent serves the GPUs as, and how many
// devices it advertises per GPU.
func (p NodeProfile) servedResource() (string, int) {
	if p.SharedReplicas > 1 {
		return "nvidia.com/gpu.shared", p.SharedReplicas
	}
	return "nvidia.com/gpu", 1
}

// containerdKey is what a containerd restart depends on.
func (p NodeProfile) containerdKey() string {
	return fmt.Sprint(p.RuncDefault, p.PodAnnotations, p.RequireEnforcer)
}

// toolkitConfig is the NVIDIA Container Toolkit's config.toml. The runtime
// reads it on every container start, so writing it takes effect at once.
func (n *Node) toolkitConfig(p NodeProfile) string {
	return fmt.Sprintf(`# NVIDIA Container Toolkit configuration of the node suite.
accept-nvidia-visible-devices-envvar-when-unprivileged = %t
accept-nvidia-visible-devices-as-volume-mounts = %t

[nvidia-container-cli]
ldconfig = "@/sbin/ldconfig"

[nvidia-container-runtime]
debug = %q
log-level = "info"
# cdi: devices come only from CDI specs, so fake device nodes are enough;
# jit-cdi and legacy need a real NVML library.
mode = "cdi"
runtimes = ["runc"]

[nvidia-container-runtime.modes.cdi]
default-kind = %q
annotation-prefixes = ["cdi.k8s.io/"]
spec-dirs = [%q]
`, !p.Hardened, p.Hardened, filepath.Join(n.Root, "log", "nvidia-container-runtime.log"), CDIKind, n.cdiDir())
}

// containerdConfig is containerd's config.toml: everything under the node's
// root, CDI on and pointed at the fake GPUs' spec, the NVIDIA runtime as
// handler "nvidia".
func (n *Node) containerdConfig(p NodeProfile) string {
	defaultRuntime := "nvidia"
	if p.RuncDefault {
		defaultRuntime = "runc"
	}
	quoted := make([]string, len(p.PodAnnotations))
	for i, a := range p.PodAnnotations {
		quoted[i] = fmt.Sprintf("%q", a)
	}
	const rt = "plugins.'io.containerd.cri.v1.runtime'"
	return fmt.Sprintf(`version = 3
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.erofs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
address = %[3]q

[ttrpc]
address = "%[3]s.ttrpc"

[plugins.'io.containerd.internal.v1.opt']
path = %[4]q

# NRI, for the agent's node enforcer; with no plugin connected it changes
# nothing.
[plugins.'io.containerd.nri.v1.nri']
disable = false
disable_connections = false
socket_path = %[16]q
plugin_path = %[17]q
plugin_config_path = %[18]q
plugin_registration_timeout = "5s"
plugin_request_timeout = "2s"
%[19]s
[plugins.'io.containerd.cri.v1.images']
# native: no overlay mounts, whatever file system the temporary root is on.
snapshotter = "native"

# ctr's image import unpacks through the transfer service, which must know it.
[[plugins.'io.containerd.transfer.v1.local'.unpack_config]]
platform = "linux/%[14]s"
snapshotter = "native"

[plugins.'io.containerd.cri.v1.images'.pinned_images]
sandbox = %[5]q

# Registries the node trusts, each a hosts.toml (TrustRegistry); read at
# every pull.
[plugins.'io.containerd.cri.v1.images'.registry]
config_path = %[15]q

[%[6]s]
# Pod network namespaces under the node's state, so Stop unmounts them.
netns_mounts_under_state_dir = true
enable_cdi = true
cdi_spec_dirs = [%[7]q]
restrict_oom_score_adj = %[8]t

[%[6]s.cni]
conf_dir = %[9]q
bin_dirs = [%[10]q]

[%[6]s.containerd]
default_runtime_name = %[11]q

[%[6]s.containerd.runtimes.runc]
runtime_type = "io.containerd.runc.v2"

[%[6]s.containerd.runtimes.nvidia]
runtime_type = "io.containerd.runc.v2"
pod_annotations = [%[12]s]

[%[6]s.containerd.runtimes.nvidia.options]
BinaryName = %[13]q
`, filepath.Join(n.Root, "containerd", "root"), filepath.Join(n.Root, "containerd", "state"), n.ContainerdSocket(),
		filepath.Join(n.Root, "containerd", "opt"), PauseImage, rt, n.cdiDir(), n.restrictOOMScoreAdj,
		filepath.Join(n.Root, "cni"), filepath.Join(n.assets, "cni"), defaultRuntime, strings.Join(quoted, ", "),
		filepath.Join(n.assets, "nvidia-container-runtime"), runtime.GOARCH, n.registryHostsDir(),
		n.NRISocket(), filepath.Join(n.Root, "nri", "plugins"), filepath.Join(n.Root, "nri", "conf.d"), requiredPlugins(p))
}

func (n *Node) registryHostsDir() string { return filepath.Join(n.Root, "containerd", "certs.d") }

// TrustRegistry has the node's containerd pull from the registry at host
// (HOST:PORT) over TLS, trusting the CA certificate in caFile, as
// /etc/containerd/certs.d/HOST:PORT/hosts.toml does on a real node.
func (n *Node) TrustRegistry(host, caFile string) error {
	return writeFile(filepath.Join(n.registryHostsDir(), host, "hosts.toml"), fmt.Sprintf(`server = "https://%[1]s"

[host."https://%[1]s"]
capabilities = ["pull", "resolve"]
ca = %[2]q
`, host, caFile))
}

// kubeletConfig is the KubeletConfiguration for a node without systemd,
// swap accounting, QoS cgroups or CNI, on cgroup v1 or v2.
func (n *Node) kubeletConfig() string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://%s
podLogsDir: %s
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
failCgroupV1: false
%s
port: %d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %d
resolvConf: ""
# Report status often: the suite waits on the node's allocatable GPUs.
nodeStatusUpdateFrequency: 2s
nodeStatusReportFrequency: 2s
# A shared test machine's disk must not evict the suite's pods or images.
evictionHard: {memory.available: "1Mi", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
localStorageCapacityIsolation: false
`, n.ContainerdSocket(), filepath.Join(n.Root, "pod-logs"), n.kubeletServing(), n.kubeletPort, n.kubeletHealthzPort)
}

// kubeletServing is where the kubelet's API listens and whom it serves. On a
// cluster: the node's address, for the API server's logs and exec, to
// clients with a certificate of the cluster's CA, authorized by the API
// server, as kubeadm sets it. Otherwise (envtest, whose API server never
// calls it): loopback only, to anyone.
func (n *Node) kubeletServing() string {
	if n.cp.ClientCAFile == "" {
		return `address: 127.0.0.1
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}`
	}
	return fmt.Sprintf(`address: %s
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %s}
authorization: {mode: Webhook}`, n.cp.Network.NodeIP, n.cp.ClientCAFile)
}

func writeFile(path, content string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(content), 0o644)
}

// requiredPlugins is the NRI default validator's section that requires the
// node enforcer, when the profile asks for it.
func requiredPlugins(p NodeProfile) string {
	if !p.RequireEnforcer {
		return ""
	}
	return `
[plugins.'io.containerd.nri.v1.nri'.default_validator]
enable = true
required_plugins = ["gpuguard"]
`
}
