package framework

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// ControlPlane is a running etcd and kube-apiserver.
type ControlPlane struct {
	env *envtest.Environment
	// Config is an administrator's, for the tests' own clients.
	Config *rest.Config
	Client kubernetes.Interface
	// AuditLog receives the API server's audit events (JSON lines).
	AuditLog string
	dir      string
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
	cp.env = &envtest.Environment{
		BinaryAssetsDirectory:    assets,
		ControlPlaneStartTimeout: 3 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	args := cp.env.ControlPlane.GetAPIServer().Configure()
	args.Set("audit-log-path", cp.AuditLog)
	args.Set("audit-policy-file", policyPath)
	args.Set("audit-log-mode", "blocking")
	if cp.Config, err = cp.env.Start(); err != nil {
		return nil, fmt.Errorf("starting the control plane: %w", err)
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
	u, err := cp.env.AddUser(envtest.User{Name: user, Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return "", err
	}
	data, err := u.KubeConfig()
	if err != nil {
		return "", err
	}
	path := filepath.Join(cp.dir, user+".kubeconfig")
	return path, os.WriteFile(path, data, 0o600)
}

// Dir is a scratch directory that lives as long as the control plane.
func (cp *ControlPlane) Dir() string { return cp.dir }

// Stop stops the control plane and removes its files.
func (cp *ControlPlane) Stop() error {
	err := cp.env.Stop()
	return errors.Join(err, os.RemoveAll(cp.dir))
}
