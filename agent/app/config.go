// Package app wires the node agent together: discovery, the hardening
// report, the device plugins, health checks and kubelet restarts.
package app

import (
	"slices"
	"time"

	"github.com/spf13/pflag"

	"github.com/gpuguard/gpuguard/agent/cdispec"
	"github.com/gpuguard/gpuguard/agent/enforcer"
	"github.com/gpuguard/gpuguard/agent/health"
	"github.com/gpuguard/gpuguard/agent/rm"
	"github.com/gpuguard/gpuguard/agent/strategy"
	"github.com/gpuguard/gpuguard/agent/verifier"
)

// Device plugin modes.
const (
	PluginAuto = "auto"
	PluginOn   = "on"
	PluginOff  = "off"
)

// Config is the agent's configuration (its flags).
type Config struct {
	Backend     string
	NodeName    string
	NVMLLibrary string

	DevicePluginDir     string
	DevicePlugin        string
	DeviceListStrategy  string
	DeviceIDStrategy    string
	MIGStrategy         string
	TimeSlicingReplicas int
	TimeSlicingRename   bool
	CDISpec             string
	CDISpecDir          string
	CDIDevRoot          string
	CDIAnnotationPrefix string

	HostRoot         string
	ToolkitConfig    string
	ContainerdConfig string
	ToolkitVersion   string

	IgnoredXIDs       []uint64
	HealthChecks      bool
	MetricsAddr       string
	RetryInterval     time.Duration
	PublishNodeLabels bool
	// HardeningInterval is how often the hardening report is computed
	// again; 0 computes it only at start.
	HardeningInterval time.Duration

	Verify                 string
	VerifyInterval         time.Duration
	VerifyExemptNamespaces []string
	CRIEndpoint            string
	PodResourcesSocket     string
	ProcRoot               string
	PolicyFile             string
	Kubeconfig             string
	Reports                bool
	VerifyContainerEvents  bool

	// Enforce runs the node enforcer, an NRI plugin on NRISocket.
	Enforce   bool
	NRISocket string
	// EnforcerLeaseNamespace is where the enforcer holds its Lease; empty
	// holds none.
	EnforcerLeaseNamespace string
}

// DefaultConfig has the flags' defaults.
func DefaultConfig() Config {
	return Config{
		Backend:             "nvml",
		DevicePluginDir:     "/var/lib/kubelet/device-plugins",
		DevicePlugin:        PluginAuto,
		DeviceListStrategy:  strategy.Auto,
		DeviceIDStrategy:    string(strategy.IDUUID),
		MIGStrategy:         rm.MIGMixed,
		TimeSlicingReplicas: 1,
		CDISpec:             cdispec.ModeAuto,
		CDISpecDir:          "/var/run/cdi",
		HostRoot:            "/",
		IgnoredXIDs:         slices.Clone(health.DefaultIgnoredXIDs),
		HealthChecks:        true,
		MetricsAddr:         ":9465",
		RetryInterval:       30 * time.Second,
		HardeningInterval:   time.Minute,
		Verify:              verifier.ModeReport,
		VerifyInterval:      10 * time.Second,
		PodResourcesSocket:  verifier.DefaultPodResourcesSocket,
		ProcRoot:            "/proc",
		// containerd before 2.0 (containerd#7318, fixed by #9661) and CRI-O
		// (cri-o#6466) hand each container event to one subscriber only:
		// where the kubelet runs Evented PLEG (alpha, off by default) on
		// them, turn this off so that the kubelet misses none.
		VerifyContainerEvents: true,
		NRISocket:             enforcer.DefaultSocket,
	}
}

// AddFlags binds the configuration to flags.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Backend, "backend", c.Backend, "GPU discovery backend: nvml (libnvidia-ml.so.1), or mock:NAME[:mig] with NAME one of dgxa100, dgxh100, dgxh200, dgxb200 (no GPU needed)")
	fs.StringVar(&c.NodeName, "node-name", c.NodeName, "node name (defaults to $NODE_NAME, then the host name); seeds mock device UUIDs")
	fs.StringVar(&c.NVMLLibrary, "nvml-library", c.NVMLLibrary, "path of libnvidia-ml.so.1 when not on the loader path")
	fs.StringVar(&c.DevicePluginDir, "device-plugin-dir", c.DevicePluginDir, "the kubelet's device plugin directory (holds kubelet.sock)")
	fs.Var(newEnumValue(&c.DevicePlugin, devicePluginModes...), "device-plugin", "auto: serve unless another plugin already serves NVIDIA GPUs on this node; on: always; off: only report")
	fs.StringVar(&c.DeviceListStrategy, "device-list-strategy", c.DeviceListStrategy, "how containers get their devices: auto, or a list of envvar, volume-mounts, cdi-annotations, cdi-cri")
	fs.Var(newEnumValue(&c.DeviceIDStrategy, idStrategies...), "device-id-strategy", "how devices are named to the runtime: uuid or index")
	fs.Var(newEnumValue(&c.MIGStrategy, migStrategies...), "mig-strategy", "none (full GPUs only) or mixed (one resource per MIG profile, e.g. nvidia.com/mig-1g.10gb)")
	fs.IntVar(&c.TimeSlicingReplicas, "time-slicing-replicas", c.TimeSlicingReplicas, "share each GPU (or MIG device) among this many containers, taking turns, with no memory or fault isolation between them; 1 shares nothing")
	fs.BoolVar(&c.TimeSlicingRename, "time-slicing-rename", c.TimeSlicingRename, "serve time-sliced shares as <resource>.shared (nvidia.com/gpu.shared), so pods asking for nvidia.com/gpu still get whole GPUs")
	fs.Var(newEnumValue(&c.CDISpec, cdiSpecModes...), "cdi-spec", "for CDI strategies: toolkit (devices must be in the toolkit's spec), own (write the agent's spec), auto (toolkit's if complete, else own)")
	fs.StringVar(&c.CDISpecDir, "cdi-spec-dir", c.CDISpecDir, "host directory the agent writes its own CDI spec to")
	fs.StringVar(&c.CDIDevRoot, "cdi-dev-root", c.CDIDevRoot, "host directory that holds the NVIDIA device nodes named in the agent's own CDI spec (default /, so /dev/nvidia0)")
	fs.StringVar(&c.CDIAnnotationPrefix, "cdi-annotation-prefix", c.CDIAnnotationPrefix, "prefix of CDI annotation keys (default cdi.k8s.io/)")
	fs.StringVar(&c.HostRoot, "host-root", c.HostRoot, "where the host's file system is mounted, for the toolkit and containerd configs")
	fs.StringVar(&c.ToolkitConfig, "toolkit-config", c.ToolkitConfig, "host path of the NVIDIA Container Toolkit config.toml (default: searched)")
	fs.StringVar(&c.ContainerdConfig, "containerd-config", c.ContainerdConfig, "host path of containerd's config.toml (default: searched)")
	fs.StringVar(&c.ToolkitVersion, "toolkit-version", c.ToolkitVersion, "NVIDIA Container Toolkit version (default: nvidia-ctk --version on the host)")
	fs.Var(xidsValue{&c.IgnoredXIDs}, "health-ignored-xids", "XIDs that do not make a GPU unhealthy (comma list, or none)")
	fs.BoolVar(&c.HealthChecks, "health-checks", c.HealthChecks, "watch NVML for XID errors")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", c.MetricsAddr, "address of /metrics and /healthz (empty: off)")
	fs.DurationVar(&c.RetryInterval, "retry-interval", c.RetryInterval, "how long to wait before retrying a failed start or registration")
	fs.Var(newEnumValue(&c.Verify, verifyModes...), "verify", "node verifier: off; report (find containers that can open a GPU the kubelet did not allocate to them: log, metric, Event); enforce (also evict their pods)")
	fs.DurationVar(&c.VerifyInterval, "verify-interval", c.VerifyInterval, "how often the verifier looks at every running container")
	fs.StringSliceVar(&c.VerifyExemptNamespaces, "verify-exempt-namespaces", c.VerifyExemptNamespaces, "namespaces whose findings are logged at info level only, besides the policy's exempt namespaces (GPU infrastructure that sees every GPU by design)")
	fs.StringVar(&c.CRIEndpoint, "cri-endpoint", c.CRIEndpoint, "the node's CRI socket (default: containerd's, k3s's or CRI-O's, found under --host-root)")
	fs.StringVar(&c.PodResourcesSocket, "pod-resources-socket", c.PodResourcesSocket, "the kubelet's PodResources socket")
	fs.StringVar(&c.ProcRoot, "proc-root", c.ProcRoot, "the host's /proc (the agent needs the host's PID namespace to see containers' roots)")
	fs.StringVar(&c.PolicyFile, "policy-file", c.PolicyFile, "gpuguard policy document (the chart mounts the policy ConfigMap): its gpuResources and exempt namespaces; default: the built-in policy")
	fs.BoolVar(&c.VerifyContainerEvents, "verify-container-events", c.VerifyContainerEvents, "look at a container as soon as the runtime reports it started (the CRI event stream); turn off where the kubelet runs Evented PLEG on containerd before 2.0 or on CRI-O, which hand each event to one subscriber")
	fs.BoolVar(&c.Enforce, "enforce", c.Enforce, "node enforcer: as an NRI plugin of the runtime, make every container's final spec grant exactly the GPUs the kubelet allocated to it (device variables, device-list mounts, CDI annotations, GPU device nodes), remove protected variables the policy does not allow, and refuse privileged containers that are not exempt")
	fs.StringVar(&c.NRISocket, "nri-socket", c.NRISocket, "the runtime's NRI socket, for --enforce")
	fs.StringVar(&c.EnforcerLeaseNamespace, "enforcer-lease-namespace", c.EnforcerLeaseNamespace, "namespace of the Lease the enforcer holds while registered (gpuguard-enforcer-<node>), which the webhook's --inject-void=auto follows (default: $POD_NAMESPACE; none without API access)")
	fs.BoolVar(&c.Reports, "reports", c.Reports, "also keep the verifier's findings in an OpenReports ClusterReport, gpuguard-node-<node> (needs its CRD)")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", c.Kubeconfig, "kubeconfig for Events and evictions (default: the pod's service account in a cluster; none outside one)")
	fs.DurationVar(&c.HardeningInterval, "hardening-interval", c.HardeningInterval, "how often the hardening report (and the node labels, when they change) is computed again; a change in the toolkit's or containerd's configuration directory triggers it at once; 0: only at start")
	fs.BoolVar(&c.PublishNodeLabels, "publish-node-labels", c.PublishNodeLabels, "label this node with the hardening report (gpuguard.io/hardened, node-restriction.kubernetes.io/gpuguard-hardened, gpuguard.io/check.*); needs $NODE_NAME or --node-name, and RBAC to get and patch nodes")
}
