package controlplane

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuguard/gpuguard/e2e/framework"
	"github.com/gpuguard/gpuguard/testsupport/testcerts"
)

// PolicyConfigMap is the name of the policy ConfigMap an installation uses.
const PolicyConfigMap = "gpuguard-policy"

// Installation is gpuguard installed on a control plane: its policy ConfigMap, the
// webhook process with certificates from a test CA, and the webhook configurations
// pointing at it.
type Installation struct {
	Namespace string
	Webhook   *Webhook
	Configs   *WebhookConfigurations
	CA        *testcerts.CA
	CertDir   string
	Binary    string
}

// WebhookMemoryLimit is the chart's memory limit of the webhook container.
const WebhookMemoryLimit = 256 << 20

// Install builds gpuguard from repoRoot and installs it in namespace with the given
// policy document; excluded namespaces are left out of the webhooks' selector.
func Install(ctx context.Context, cp *ControlPlane, repoRoot, namespace, policyYAML string, excluded ...string) (*Installation, error) {
	in := &Installation{Namespace: namespace, CertDir: filepath.Join(cp.Dir(), "certs")}
	var err error
	if in.Binary, err = framework.BuildGPUGuard(repoRoot, cp.Dir()); err != nil {
		return nil, err
	}
	if err := EnsureNamespace(ctx, cp, namespace, nil); err != nil {
		return nil, err
	}
	if err := in.WritePolicy(ctx, cp, policyYAML); err != nil {
		return nil, err
	}
	if in.CA, err = testcerts.NewCA(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(in.CertDir, 0o700); err != nil {
		return nil, err
	}
	if err := in.CA.WriteServing(in.CertDir); err != nil {
		return nil, err
	}
	kubeconfig, err := cp.Kubeconfig("gpuguard")
	if err != nil {
		return nil, err
	}
	if in.Webhook, err = NewWebhook(in.Binary, kubeconfig, in.CertDir, cp.Dir()); err != nil {
		return nil, err
	}
	// As the chart does, from the container's limit.
	in.Webhook.Env = []string{"GPUGUARD_MEMORY_LIMIT=" + strconv.Itoa(WebhookMemoryLimit)}
	if err := in.StartWebhook(ctx); err != nil {
		return nil, err
	}
	if in.Configs, err = GPUGuardWebhooks(filepath.Join(repoRoot, "charts", "gpuguard"), namespace, excluded...); err != nil {
		return nil, err
	}
	in.Configs.PointAt(in.Webhook.Port, in.CA.PEM)
	return in, in.Configs.Install(ctx, cp.Client)
}

// StartWebhook starts the webhook process and waits until it is ready.
func (in *Installation) StartWebhook(ctx context.Context) error {
	if err := in.Webhook.Start(in.Namespace + "/" + PolicyConfigMap); err != nil {
		return err
	}
	if err := in.Webhook.WaitReady(ctx, 2*time.Minute); err != nil {
		return fmt.Errorf("%w\nwebhook log:\n%s", err, framework.Tail(in.Webhook.Log))
	}
	return nil
}

// WritePolicy creates or updates the policy ConfigMap.
func (in *Installation) WritePolicy(ctx context.Context, cp *ControlPlane, policyYAML string) error {
	cms := cp.Client.CoreV1().ConfigMaps(in.Namespace)
	data := map[string]string{"policy.yaml": policyYAML}
	existing, err := cms.Get(ctx, PolicyConfigMap, metav1.GetOptions{})
	if err == nil {
		existing.Data = data
		_, err = cms.Update(ctx, existing, metav1.UpdateOptions{})
		return err
	}
	if !apierrors.IsNotFound(err) {
		return err
	}
	_, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: PolicyConfigMap, Namespace: in.Namespace}, Data: data}, metav1.CreateOptions{})
	return err
}

// Uninstall stops the webhook and removes the webhook configurations.
func (in *Installation) Uninstall(ctx context.Context, cp *ControlPlane) error {
	var errs []error
	if in.Configs != nil {
		errs = append(errs, in.Configs.Remove(ctx, cp.Client))
	}
	if in.Webhook != nil {
		errs = append(errs, in.Webhook.Stop())
	}
	return errors.Join(errs...)
}

// EnsureNamespace creates a namespace with labels unless it exists.
func EnsureNamespace(ctx context.Context, cp *ControlPlane, name string, labels map[string]string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	_, err := cp.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}
