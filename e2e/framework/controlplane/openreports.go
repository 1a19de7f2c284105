package controlplane

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	openreports "github.com/openreports/reports-api/apis/openreports.io/v1alpha1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/gpuguard/gpuguard/e2e/framework"
)

// ReportsClient reads and writes OpenReports objects on cp.
func ReportsClient(cp *ControlPlane) (client.Client, error) {
	scheme := runtime.NewScheme()
	if err := openreports.Install(scheme); err != nil {
		return nil, err
	}
	return client.New(cp.Config, client.Options{Scheme: scheme})
}

// OpenReportsCRDs are the CRD files the chart ships, under charts/gpuguard/files/openreports.
var OpenReportsCRDs = []string{"openreports.io_reports.yaml", "openreports.io_clusterreports.yaml"}

// InstallOpenReportsCRDs creates the chart's OpenReports CRDs and waits until
// the API server serves them; remove deletes them again.
func InstallOpenReportsCRDs(ctx context.Context, cp *ControlPlane, repoRoot string) (remove func(), err error) {
	scheme := runtime.NewScheme()
	utilruntime.Must(apiextensionsv1.AddToScheme(scheme))
	c, err := client.New(cp.Config, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	var created []*apiextensionsv1.CustomResourceDefinition
	remove = func() {
		for _, crd := range created {
			_ = c.Delete(context.Background(), crd)
		}
	}
	for _, f := range OpenReportsCRDs {
		data, err := os.ReadFile(filepath.Join(repoRoot, "charts", "gpuguard", "files", "openreports", f))
		if err != nil {
			return remove, err
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := sigsyaml.Unmarshal(data, crd); err != nil {
			return remove, fmt.Errorf("%s: %w", f, err)
		}
		if err := c.Create(ctx, crd); err != nil && !apierrors.IsAlreadyExists(err) {
			return remove, err
		}
		created = append(created, crd)
		if err := framework.Poll(ctx, time.Minute, func() (bool, error) { return established(ctx, c, crd.Name), nil }); err != nil {
			return remove, fmt.Errorf("CRD %s not established: %w", crd.Name, err)
		}
	}
	return remove, nil
}

func established(ctx context.Context, c client.Client, name string) bool {
	got := &apiextensionsv1.CustomResourceDefinition{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, got); err != nil {
		return false
	}
	for _, cond := range got.Status.Conditions {
		if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
			return true
		}
	}
	return false
}
