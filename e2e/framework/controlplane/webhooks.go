package controlplane

import (
	"context"
	"fmt"
	"net/url"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuguard/gpuguard/e2e/framework"
)

// WebhookConfigurations are gpuguard's two admission configurations.
type WebhookConfigurations struct {
	Mutating   *admissionregistrationv1.MutatingWebhookConfiguration
	Validating *admissionregistrationv1.ValidatingWebhookConfiguration
}

// PointAt rewrites every webhook's client config to https://localhost:PORT/PATH with
// the given CA bundle: Endpoints cannot point at loopback, so a webhook running
// beside the API server is reached by URL. The path is kept from the Service
// reference, or from the URL when pointed before.
func (w *WebhookConfigurations) PointAt(port int, caBundle []byte) {
	rewrite := func(cc *admissionregistrationv1.WebhookClientConfig) {
		path := "/"
		switch {
		case cc.Service != nil && cc.Service.Path != nil:
			path = *cc.Service.Path
		case cc.URL != nil:
			if u, err := url.Parse(*cc.URL); err == nil {
				path = u.Path
			}
		}
		target := fmt.Sprintf("https://localhost:%d%s", port, path)
		cc.Service, cc.URL, cc.CABundle = nil, &target, caBundle
	}
	for i := range w.Mutating.Webhooks {
		rewrite(&w.Mutating.Webhooks[i].ClientConfig)
	}
	for i := range w.Validating.Webhooks {
		rewrite(&w.Validating.Webhooks[i].ClientConfig)
	}
}

// Install creates or replaces both configurations.
func (w *WebhookConfigurations) Install(ctx context.Context, c kubernetes.Interface) error {
	if err := w.InstallMutating(ctx, c); err != nil {
		return err
	}
	vc := c.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	_ = vc.Delete(ctx, w.Validating.Name, metav1.DeleteOptions{})
	v := w.Validating.DeepCopy()
	v.ResourceVersion = ""
	_, err := vc.Create(ctx, v, metav1.CreateOptions{})
	return err
}

// InstallMutating creates or replaces the mutating configuration alone.
func (w *WebhookConfigurations) InstallMutating(ctx context.Context, c kubernetes.Interface) error {
	mc := c.AdmissionregistrationV1().MutatingWebhookConfigurations()
	_ = mc.Delete(ctx, w.Mutating.Name, metav1.DeleteOptions{})
	m := w.Mutating.DeepCopy()
	m.ResourceVersion = ""
	_, err := mc.Create(ctx, m, metav1.CreateOptions{})
	return err
}

// RemoveMutating deletes the mutating configuration, as an outage of the mutating
// webhook (or a cluster without it) would leave things.
func (w *WebhookConfigurations) RemoveMutating(ctx context.Context, c kubernetes.Interface) error {
	err := c.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ctx, w.Mutating.Name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// WaitEnforcing waits until the API server calls gpuguard's webhooks for a
// namespace: a dry-run of a plain pod there comes back with void injected.
func WaitEnforcing(ctx context.Context, c kubernetes.Interface, namespace string, timeout time.Duration) error {
	probe := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "gpuguard-probe"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "probe", Image: "busybox"}}}}
	return framework.Poll(ctx, timeout, func() (bool, error) {
		p, err := c.CoreV1().Pods(namespace).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return false, nil
		}
		env := p.Spec.Containers[0].Env
		return len(env) > 0 && env[len(env)-1].Name == "NVIDIA_VISIBLE_DEVICES" && env[len(env)-1].Value == "void", nil
	})
}

// Remove deletes both configurations.
func (w *WebhookConfigurations) Remove(ctx context.Context, c kubernetes.Interface) error {
	err := c.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, w.Validating.Name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return w.RemoveMutating(ctx, c)
}
