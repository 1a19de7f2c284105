package controlplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/gpuguard/gpuguard/e2e/framework"
)

// ControlPlane is a running etcd and kube-apiserver: envtest's
// (StartControlPlane) or a whole cluster's (StartClusterControlPlane).
type ControlPlane struct {
	// Config is an administrator's, for the tests' own clients.
	Config *rest.Config
	Client kubernetes.Interface
	// AuditLog receives the API server's audit events (JSON lines).
	AuditLog string
	dir      string

	// kubeconfig makes a kubeconfig for a user in groups.
	kubeconfig func(user string, groups ...string) ([]byte, error)
	// nodeAuthorizer: the API server authorizes kubelets by node identity,
	// so a kubelet must present one (system:node:NAME in system:nodes).
	nodeAuthorizer bool
	// Network is the cluster's pod and service networking; nil where pods
	// have none of their own (envtest).
	Network *ClusterNetwork
	// ClientCAFile is the CA of the cluster's client certificates, which a
	// kubelet trusts for the API server's calls; empty for envtest, whose
	// API server does not call kubelets.
	ClientCAFile string
	stop         func() error
	// stopControllers stops what recreates or reschedules pods, so that a
	// node can be drained for good; nil where nothing does (envtest).
	stopControllers func() error
	// restartAPIServer stops the API server and starts it again, as an
	// upgrade or a crash of the control plane does; nil for envtest.
	restartAPIServer func(ctx context.Context) error
	// logs is the directory of the control plane's logs, if it keeps any.
	logs     string
	stopOnce sync.Once
	stopErr  error
}

// auditPolicy records request metadata, which carries admission audit annotations.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    resources: [{group: "", resources: [pods, pods/ephemeralcontainers]}]
  - level: None
`

// StartControlPlane starts etcd and kube-apiserver from the binaries in assets
// (hack/build-upstream.sh builds them into _output/bin).
func StartControlPlane(assets string) (*ControlPlane, error) {
	for _, name := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(assets, name)); err != nil {
			return nil, fmt.Errorf("%s not found in %s: run hack/build-upstream.sh (make e2e does)", name, assets)
		}
	}
	dir, err := os.MkdirTemp("", "gpuguard-e2e-")
	if err != nil {
		return nil, err
	}
	cp := &ControlPlane{dir: dir, AuditLog: filepath.Join(dir, "audit.log")}
	policyPath := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policyPath, []byte(auditPolicy), 0o600); err != nil {
		return nil, err
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory:    assets,
		ControlPlaneStartTimeout: 3 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	args := env.ControlPlane.GetAPIServer().Configure()
	args.Set("audit-log-path", cp.AuditLog)
	args.Set("audit-policy-file", policyPath)
	args.Set("audit-log-mode", "blocking")
	if cp.Config, err = env.Start(); err != nil {
		return nil, fmt.Errorf("starting the control plane: %w", err)
	}
	cp.stop = env.Stop
	cp.kubeconfig = func(user string, groups ...string) ([]byte, error) {
		u, err := env.AddUser(envtest.User{Name: user, Groups: groups}, nil)
		if err != nil {
			return nil, err
		}
		return u.KubeConfig()
	}
	// Tests that want admission warnings collect them on a client of their own.
	cp.Config.WarningHandler = rest.NoWarnings{}
	if cp.Client, err = kubernetes.NewForConfig(cp.Config); err != nil {
		return nil, errors.Join(err, cp.Stop())
	}
	return cp, nil
}

// Kubeconfig writes a kubeconfig for an administrator, for processes such as the
// webhook, and returns its path.
func (cp *ControlPlane) Kubeconfig(user string) (string, error) {
	return cp.KubeconfigFor(user, "system:masters")
}

// KubeconfigFor writes a kubeconfig for user in groups and returns its path.
func (cp *ControlPlane) KubeconfigFor(user string, groups ...string) (string, error) {
	data, err := cp.kubeconfig(user, groups...)
	if err != nil {
		return "", err
	}
	path := filepath.Join(cp.dir, strings.ReplaceAll(user, ":", "-")+".kubeconfig")
	return path, os.WriteFile(path, data, 0o600)
}

// KubeletKubeconfig writes the kubeconfig a node's kubelet runs with: its
// node identity where the API server authorizes nodes, else an administrator.
func (cp *ControlPlane) KubeletKubeconfig(node string) (string, error) {
	if cp.nodeAuthorizer {
		return cp.KubeconfigFor("system:node:"+node, "system:nodes")
	}
	return cp.Kubeconfig("kubelet-" + node)
}

// RestartAPIServer stops the API server (SIGTERM: it drains as it does in
// a rolling control-plane upgrade), starts it again and waits until it is
// ready. Every watch and connection to it is cut meanwhile.
func (cp *ControlPlane) RestartAPIServer(ctx context.Context) error {
	if cp.restartAPIServer == nil {
		return errors.New("this control plane cannot restart its API server")
	}
	return cp.restartAPIServer(ctx)
}

// StopControllers stops the controller manager and the scheduler, if the
// control plane runs them: pods deleted afterwards stay deleted.
func (cp *ControlPlane) StopControllers() error {
	if cp.stopControllers == nil {
		return nil
	}
	return cp.stopControllers()
}

// Dir is a scratch directory that lives as long as the control plane.
func (cp *ControlPlane) Dir() string { return cp.dir }

// Stop stops the control plane and removes its files. Calls after the first
// return its result.
func (cp *ControlPlane) Stop() error {
	cp.stopOnce.Do(func() { cp.stopErr = errors.Join(cp.stop(), os.RemoveAll(cp.dir)) })
	return cp.stopErr
}

// Metrics reads the API server's Prometheus metrics.
func (cp *ControlPlane) Metrics(ctx context.Context) (map[string]float64, error) {
	raw, err := cp.Client.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	return framework.ParseMetrics(bytes.NewReader(raw))
}
