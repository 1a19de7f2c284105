//go:build e2e

package cluster

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuguard/gpuguard/e2e/framework"
	"github.com/gpuguard/gpuguard/e2e/framework/controlplane"
)

const (
	unpullableReleaseNS = "gpuguard-unpullable"
	unpullableTenantNS  = "unpullable-tenant"
)

// TestFailedInstallBlocksNothing installs the chart with a webhook image that
// cannot be pulled, in enforce mode (the pods' webhook fails closed), with
// helm install --wait as users run it, and with --atomic. While the install
// waits, a pod is created in a guarded namespace: nothing has registered a
// webhook configuration, so nothing blocks it. After the install fails, no
// webhook configuration of gpuguard's is left. The policy check hook is off:
// it runs the same image, and would fail the install before the chart's
// resources are created.
func TestFailedInstallBlocksNothing(t *testing.T) {
	ctx := context.Background()
	if err := controlplane.EnsureNamespace(ctx, s.cp, unpullableTenantNS, nil); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, flags string }{{"wait", ""}, {"atomic", " --atomic"}} {
		t.Run(tc.name, func(t *testing.T) {
			sh := newShell(t)
			install := "helm install gpuguard oci://$REGISTRY/charts/gpuguard -n " + unpullableReleaseNS +
				" --create-namespace --wait --timeout 60s --set policy.mode=enforce --set policy.checkHook.enabled=false" +
				" --set webhook.image.repository=$REGISTRY/absent/gpuguard" + tc.flags
			type result struct {
				out string
				err error
			}
			done := make(chan result, 1)
			go func() {
				out, err := sh.run(install)
				done <- result{out, err}
			}()
			waitImagePullFails(t, ctx)
			if _, err := dryRunViolatingPod(t, unpullableTenantNS); err != nil {
				t.Errorf("while the install waits on a webhook that cannot start, a pod creation in a guarded namespace failed: %v", err)
			}
			r := <-done
			if r.err == nil {
				t.Fatalf("%s succeeded with an image that cannot be pulled:\n%s", install, r.out)
			}
			if tc.flags == "" {
				t.Cleanup(func() {
					if out, err := sh.run("helm uninstall gpuguard -n " + unpullableReleaseNS + " --wait"); err != nil {
						t.Errorf("helm uninstall: %v\n%s", err, out)
					}
				})
			}
			noWebhookConfigurations(t, ctx)
		})
	}
}

// waitImagePullFails waits until a pod of the webhook's reports that its
// image cannot be pulled: the install is waiting on a webhook that will not
// come up.
func waitImagePullFails(t *testing.T, ctx context.Context) {
	t.Helper()
	err := framework.Poll(ctx, 2*time.Minute, func() (bool, error) {
		pods, err := s.cp.Client.CoreV1().Pods(unpullableReleaseNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, p := range pods.Items {
			for _, c := range p.Status.ContainerStatuses {
				if w := c.State.Waiting; w != nil && (w.Reason == "ErrImagePull" || w.Reason == "ImagePullBackOff") {
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no pod of the release failed to pull its image: %v", err)
	}
}

// noWebhookConfigurations: neither of gpuguard's webhook configurations
// exists.
func noWebhookConfigurations(t *testing.T, ctx context.Context) {
	t.Helper()
	reg := s.cp.Client.AdmissionregistrationV1()
	if _, err := reg.MutatingWebhookConfigurations().Get(ctx, controlplane.ReleaseName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("after the failed install, MutatingWebhookConfiguration %s: %v, want none", controlplane.ReleaseName, err)
	}
	if _, err := reg.ValidatingWebhookConfigurations().Get(ctx, controlplane.ReleaseName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("after the failed install, ValidatingWebhookConfiguration %s: %v, want none", controlplane.ReleaseName, err)
	}
}
