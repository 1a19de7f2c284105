//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuguard/gpuguard/e2e/framework"
	"github.com/gpuguard/gpuguard/e2e/framework/controlplane"
)

// Namespaces of the suite. The release namespace and the excluded ones are outside
// the webhooks' namespaceSelector; the others are guarded.
const (
	releaseNS      = "gpuguard"
	enforceNS      = "team-enforce"
	warnNS         = "team-warn"
	auditNS        = "team-audit"
	excludedNS     = "kube-excluded"
	operatorNS     = "gpu-operator"
	selfManagedNS  = "team-selfmanaged"
	celProbeNS     = "cel-probe" // left out by the webhooks, not by the CEL backstop
	policyName     = controlplane.PolicyConfigMap
	webhookTimeout = time.Minute
)

// suitePolicy is the default policy, with namespace labels allowed to relax the
// mode (so that warn and audit namespaces can be shown) and one service account
// exemption.
const suitePolicy = `apiVersion: gpuguard.io/v1alpha1
kind: GPUGuardPolicy
spec:
  namespaceModeOverride: Any
  exemptions:
    serviceAccounts:
      - {namespace: gpu-operator, name: nvidia-device-plugin}
`

var s *suite

type suite struct {
	cp *controlplane.ControlPlane
	*controlplane.Installation
}

func TestMain(m *testing.M) {
	if kind := os.Getenv(referenceWebhookEnv); kind != "" {
		os.Exit(serveReferenceWebhook(kind))
	}
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		code = 1
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	root, err := filepath.Abs("..")
	if err != nil {
		return 1, err
	}
	cp, err := controlplane.StartControlPlane(filepath.Join(root, "_output", "bin"))
	if err != nil {
		return 1, err
	}
	defer cp.Stop()
	ctx := context.Background()
	for name, mode := range map[string]string{enforceNS: "", warnNS: "warn", auditNS: "audit", excludedNS: "", operatorNS: ""} {
		var labels map[string]string
		if mode != "" {
			labels = map[string]string{"gpuguard.io/mode": mode}
		}
		if err := controlplane.EnsureNamespace(ctx, cp, name, labels); err != nil {
			return 1, err
		}
	}
	// The runtime classes the GPU Operator creates, so that pods naming them are
	// judged by gpuguard rather than refused for a missing RuntimeClass.
	for _, name := range []string{"nvidia", "nvidia-cdi", "nvidia-legacy"} {
		rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Handler: name}
		if _, err := cp.Client.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{}); err != nil {
			return 1, err
		}
	}
	if err := controlplane.EnsureNamespace(ctx, cp, celProbeNS, nil); err != nil {
		return 1, err
	}
	in, err := controlplane.Install(ctx, cp, root, releaseNS, suitePolicy, excludedNS, selfManagedNS, chartNamespace, celProbeNS)
	if err != nil {
		return 1, err
	}
	defer in.Uninstall(ctx, cp)
	s = &suite{cp: cp, Installation: in}
	if err := s.waitEnforcing(ctx); err != nil {
		return 1, fmt.Errorf("%w\nwebhook log:\n%s", err, framework.Tail(in.Webhook.Log))
	}
	code := m.Run()
	if code != 0 {
		fmt.Fprintf(os.Stderr, "webhook log (last lines):\n%s\n", framework.Tail(in.Webhook.Log))
	}
	return code, nil
}

func (s *suite) waitEnforcing(ctx context.Context) error {
	return controlplane.WaitEnforcing(ctx, s.cp.Client, enforceNS, webhookTimeout)
}

func (s *suite) writePolicy(ctx context.Context, policyYAML string) error {
	return s.WritePolicy(ctx, s.cp, policyYAML)
}

func (s *suite) startWebhook(ctx context.Context) error {
	return s.StartWebhook(ctx)
}
