//go:build e2e

package e2e

import (
	"context"
	"slices"
	"testing"
	"time"

	openreports "github.com/openreports/reports-api/apis/openreports.io/v1alpha1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpuguard/gpuguard/e2e/framework"
	"github.com/gpuguard/gpuguard/e2e/framework/controlplane"
)

// TestBackgroundAuditWritesOpenReports installs the OpenReports CRDs the chart
// ships, creates a pod from before gpuguard's install, and runs a webhook with
// the background audit: an OpenReports Report in the pod's namespace names the
// pod and its rule, and the result goes once the pod does.
func TestBackgroundAuditWritesOpenReports(t *testing.T) {
	ctx := context.Background()
	c := reportsClient(t)
	installOpenReportsCRDs(t)
	ns := "audit-reports"
	if err := controlplane.EnsureNamespace(ctx, s.cp, ns, nil); err != nil {
		t.Fatal(err)
	}
	createBeforeInstall(t, func() bool {
		_, err := s.cp.Client.CoreV1().Pods(ns).Create(ctx, plainPod("leak"), metav1.CreateOptions{})
		return err == nil || apierrors.IsAlreadyExists(err)
	})

	kubeconfig, err := s.cp.Kubeconfig("gpuguard-auditor")
	if err != nil {
		t.Fatal(err)
	}
	wh, err := controlplane.NewWebhook(s.Binary, kubeconfig, s.CertDir, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	wh.Extra = []string{"--audit-interval", "10s", "--audit-reports"}
	if err := wh.Start(releaseNS + "/" + policyName); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = wh.Stop() }()

	report := &openreports.Report{}
	key := client.ObjectKey{Namespace: ns, Name: "gpuguard"}
	err = framework.Poll(ctx, time.Minute, func() (bool, error) {
		if c.Get(ctx, key, report) != nil {
			return false, nil
		}
		return slices.ContainsFunc(report.Results, func(r openreports.ReportResult) bool {
			return r.Rule == "final-state" && r.Result == "fail" && len(r.Subjects) == 1 && r.Subjects[0].Name == "leak"
		}), nil
	})
	if err != nil {
		t.Fatalf("no Report in %s names the pod from before the install with final-state: %+v\n%s", ns, report, framework.Tail(wh.Log))
	}
	if report.Source != "gpuguard" || report.Summary.Fail < 1 {
		t.Errorf("report source %q, summary %+v", report.Source, report.Summary)
	}

	deletePod(ctx, ns, "leak")
	err = framework.Poll(ctx, time.Minute, func() (bool, error) {
		return apierrors.IsNotFound(c.Get(ctx, key, &openreports.Report{})), nil
	})
	if err != nil {
		t.Errorf("the Report stayed after its only object was deleted: %v\n%s", err, framework.Tail(wh.Log))
	}
}

func reportsClient(t *testing.T) client.Client {
	t.Helper()
	c, err := controlplane.ReportsClient(s.cp)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// installOpenReportsCRDs installs the chart's OpenReports CRDs for the test
// and deletes them when it ends, so that the suite's other tests see a cluster
// without them.
func installOpenReportsCRDs(t *testing.T) {
	t.Helper()
	remove, err := controlplane.InstallOpenReportsCRDs(context.Background(), s.cp, "..")
	t.Cleanup(remove)
	if err != nil {
		t.Fatal(err)
	}
}
