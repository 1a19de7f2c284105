//go:build e2e

package cluster

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuguard/gpuguard/e2e/framework"
)

// backstopName and configName are the chart's names for release gpuguard.
const backstopName, configName = "gpuguard-backstop", "gpuguard"

// testBackstopOutlivesWebhookConfigurations deletes gpuguard's two webhook
// configurations, as the usual runbook does when a webhook blocks a
// cluster: once the garbage collector has acted on their dependents, the
// backstop's four objects are still there, unchanged, and a leaking pod is
// denied by the ValidatingAdmissionPolicy. The configurations are then
// restored and the webhook answers again. With the backstop owned by the
// ValidatingWebhookConfiguration, as it once was, the collector removed it
// with the configuration.
func testBackstopOutlivesWebhookConfigurations(t *testing.T) {
	ctx := context.Background()
	ar := s.cp.Client.AdmissionregistrationV1()
	uids := waitBackstop(t)
	vwc, err := ar.ValidatingWebhookConfigurations().Get(ctx, configName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mwc, err := ar.MutatingWebhookConfigurations().Get(ctx, configName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The canary tells when the collector has acted on the configuration's
	// dependents: it is one of them.
	canary := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "gpuguard-gc-canary", OwnerReferences: []metav1.OwnerReference{{
		APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingWebhookConfiguration", Name: vwc.Name, UID: vwc.UID}}}}
	if _, err := s.cp.Client.RbacV1().ClusterRoles().Create(ctx, canary, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { restoreWebhookConfigurations(t, vwc, mwc) })
	if err := ar.ValidatingWebhookConfigurations().Delete(ctx, configName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := ar.MutatingWebhookConfigurations().Delete(ctx, configName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err = framework.Poll(ctx, 2*time.Minute, func() (bool, error) {
		_, err := s.cp.Client.RbacV1().ClusterRoles().Get(ctx, canary.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("the garbage collector did not remove the canary owned by the deleted configuration: %v", err)
	}
	if now := backstopUIDs(t); !slices.Equal(now, uids) {
		t.Fatalf("after the webhook configurations were deleted the backstop is %v, want the same objects %v", now, uids)
	}
	leak := scheduledProbe("backstop-leak")
	leak.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}
	var last error
	err = framework.Poll(ctx, time.Minute, func() (bool, error) {
		_, last = s.cp.Client.CoreV1().Pods(tenantNS).Create(ctx, leak, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return last != nil && strings.Contains(last.Error(), "ValidatingAdmissionPolicy '"+backstopName+"'"), nil
	})
	if err != nil {
		t.Fatalf("with the webhook configurations deleted, a leaking pod got %v, want the backstop's denial", last)
	}
}

// waitBackstop waits until the chart's webhook has applied the backstop and
// returns its objects' UIDs.
func waitBackstop(t *testing.T) []types.UID {
	t.Helper()
	var uids []types.UID
	err := framework.Poll(context.Background(), 2*time.Minute, func() (bool, error) {
		uids = backstopUIDs(t)
		return !slices.Contains(uids, ""), nil
	})
	if err != nil {
		t.Fatalf("the chart's webhook did not apply the backstop: %v (UIDs %v)", err, uids)
	}
	return uids
}

// backstopUIDs: the UIDs of the backstop's policies and bindings, "" for
// one that is missing.
func backstopUIDs(t *testing.T) []types.UID {
	t.Helper()
	ctx := context.Background()
	ar := s.cp.Client.AdmissionregistrationV1()
	uid := func(m metav1.Object, err error) types.UID {
		if err != nil {
			if !apierrors.IsNotFound(err) {
				t.Fatal(err)
			}
			return ""
		}
		return m.GetUID()
	}
	get := metav1.GetOptions{}
	vap, err := ar.ValidatingAdmissionPolicies().Get(ctx, backstopName, get)
	a := uid(vap, err)
	vapb, err := ar.ValidatingAdmissionPolicyBindings().Get(ctx, backstopName, get)
	b := uid(vapb, err)
	mapol, err := ar.MutatingAdmissionPolicies().Get(ctx, backstopName, get)
	c := uid(mapol, err)
	mapb, err := ar.MutatingAdmissionPolicyBindings().Get(ctx, backstopName, get)
	return []types.UID{a, b, c, uid(mapb, err)}
}

// restoreWebhookConfigurations creates the deleted configurations again, as
// they were, and waits until the webhook denies a leaking pod again.
func restoreWebhookConfigurations(t *testing.T, vwc *admissionregistrationv1.ValidatingWebhookConfiguration,
	mwc *admissionregistrationv1.MutatingWebhookConfiguration) {
	ctx := context.Background()
	ar := s.cp.Client.AdmissionregistrationV1()
	vwc.ObjectMeta = fresh(vwc.ObjectMeta)
	mwc.ObjectMeta = fresh(mwc.ObjectMeta)
	if _, err := ar.ValidatingWebhookConfigurations().Create(ctx, vwc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Error(err)
	}
	if _, err := ar.MutatingWebhookConfigurations().Create(ctx, mwc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Error(err)
	}
	leak := scheduledProbe("restored-leak")
	leak.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}
	var last error
	err := framework.Poll(ctx, time.Minute, func() (bool, error) {
		_, last = s.cp.Client.CoreV1().Pods(tenantNS).Create(ctx, leak, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		rules, notDenial := framework.DeniedRules(last)
		return notDenial == nil && slices.Contains(rules, "device-env"), nil
	})
	if err != nil {
		t.Errorf("after restoring the webhook configurations, a leaking pod got %v, want gpuguard's denial", last)
	}
}

// fresh is m without what the API server sets, for creating it again. The
// owner stays: the webhook registers its configurations owned by the
// release's ClusterRole, so that helm uninstall takes them; restored
// without it, they outlived the release and refused every later pod.
func fresh(m metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: m.Name, Labels: m.Labels, Annotations: m.Annotations, OwnerReferences: m.OwnerReferences}
}
