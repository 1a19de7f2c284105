package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuguard/gpuguard/internal/kubeconfig"
	"github.com/gpuguard/gpuguard/internal/wellknown"
)

// What gpuguard writes into a cluster at run time, which `helm uninstall`
// does not remove because the chart did not render it: the background
// audit's Reports, the agents' ClusterReports, the agents' node labels,
// the node enforcers' and the audit's Leases, and (normally collected with
// their owner) the CEL backstop's admission policies and bindings.

type cleanupOptions struct {
	namespace string
	dryRun    bool
	kube      kubeconfig.Flags
	timeout   time.Duration
}

func newCleanupCommand() *cobra.Command {
	o := &cleanupOptions{}
	cmd := &cobra.Command{
		Use:   "cleanup --namespace RELEASE_NAMESPACE [--dry-run] [--kubeconfig PATH]",
		Short: "Remove what gpuguard wrote into a cluster at run time, after helm uninstall",
		Long: `cleanup removes what gpuguard's webhook and agents wrote into the cluster
while they ran, which helm uninstall leaves because the chart did not render it:

  - OpenReports Reports and ClusterReports labelled app.kubernetes.io/managed-by=gpuguard
    (the background audit's and the agents'); the CRDs stay;
  - the agents' node labels: gpuguard.io/hardened, gpuguard.io/check.*,
    node-restriction.kubernetes.io/gpuguard-hardened;
  - the node enforcers' Leases (gpuguard-enforcer-<node>) and the audit's
    (gpuguard-audit) in --namespace, the release namespace;
  - the CEL backstop's admission policies and bindings, where their owner's
    removal has not already collected them.

Run it after helm uninstall: while gpuguard runs, its agents write their
labels and reports again. --dry-run lists what it would remove.

Exit status: 0 when everything is removed (or was already gone), 1 when
something could not be, 2 for usage or configuration errors.`,
		Example: `  helm uninstall gpuguard -n gpuguard
  gpuguard cleanup --namespace gpuguard`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := o.kube.Load()
			if err != nil {
				return &exitError{exitUsage, err.Error()}
			}
			cfg.Timeout = o.timeout
			kube, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return &exitError{exitUsage, err.Error()}
			}
			dyn, err := dynamic.NewForConfig(cfg)
			if err != nil {
				return &exitError{exitUsage, err.Error()}
			}
			return o.run(cmd.Context(), cmd.OutOrStdout(), kube, dyn)
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&o.namespace, "namespace", "n", "", "the namespace gpuguard was installed in, which holds its Leases (required)")
	fl.BoolVar(&o.dryRun, "dry-run", false, "list what would be removed, remove nothing")
	o.kube.AddFlags(fl)
	fl.DurationVar(&o.timeout, "timeout", 30*time.Second, "the limit of each request to the API server")
	_ = cmd.MarkFlagRequired("namespace")
	return cmd
}

// cleanupTarget is a kind of object gpuguard writes, found by its labels.
type cleanupTarget struct {
	what string
	gvr  schema.GroupVersionResource
	// selector picks gpuguard's own.
	selector string
}

var (
	managedBy        = wellknown.ManagedByLabel + "=" + wellknown.ManagedBy
	backstopSelector = labels.SelectorFromSet(wellknown.OwnedLabels(wellknown.ComponentCELBackstop)).String()
	cleanupTargets   = []cleanupTarget{
		{"Report", schema.GroupVersionResource{Group: "openreports.io", Version: "v1alpha1", Resource: "reports"}, managedBy},
		{"ClusterReport", schema.GroupVersionResource{Group: "openreports.io", Version: "v1alpha1", Resource: "clusterreports"}, managedBy},
		{"ValidatingAdmissionPolicyBinding", schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingadmissionpolicybindings"}, backstopSelector},
		{"ValidatingAdmissionPolicy", schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingadmissionpolicies"}, backstopSelector},
		{"MutatingAdmissionPolicyBinding", schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "mutatingadmissionpolicybindings"}, backstopSelector},
		{"MutatingAdmissionPolicy", schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "mutatingadmissionpolicies"}, backstopSelector},
	}
)

func (o *cleanupOptions) run(ctx context.Context, out io.Writer, kube kubernetes.Interface, dyn dynamic.Interface) error {
	if o.namespace == "" {
		return &exitError{exitUsage, "--namespace: name the namespace gpuguard was installed in"}
	}
	if ctx == nil {
		ctx = context.Background()
	}
	verb := "removed"
	if o.dryRun {
		verb = "would remove"
	}
	var failed []error
	for _, t := range cleanupTargets {
		failed = append(failed, o.cleanObjects(ctx, out, dyn, t, verb)...)
	}
	failed = append(failed, o.cleanNodeLabels(ctx, out, kube, verb)...)
	failed = append(failed, o.cleanLeases(ctx, out, kube, verb)...)
	if err := errors.Join(failed...); err != nil {
		return &exitError{exitFailed, err.Error()}
	}
	return nil
}

// cleanObjects deletes target's objects of gpuguard's; a kind the cluster
// does not serve (no OpenReports CRDs, no admission policy API) has none.
func (o *cleanupOptions) cleanObjects(ctx context.Context, out io.Writer, dyn dynamic.Interface, t cleanupTarget, verb string) []error {
	list, err := dyn.Resource(t.gvr).List(ctx, metav1.ListOptions{LabelSelector: t.selector})
	if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
		return nil
	}
	if err != nil {
		return []error{fmt.Errorf("listing %ss: %w", t.what, err)}
	}
	var failed []error
	for _, item := range list.Items {
		name := item.GetName()
		if ns := item.GetNamespace(); ns != "" {
			name = ns + "/" + name
		}
		if !o.dryRun {
			err := dyn.Resource(t.gvr).Namespace(item.GetNamespace()).Delete(ctx, item.GetName(), metav1.DeleteOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				failed = append(failed, fmt.Errorf("deleting %s %s: %w", t.what, name, err))
				continue
			}
		}
		fmt.Fprintf(out, "%s %s %s\n", verb, t.what, name)
	}
	return failed
}

// cleanNodeLabels takes gpuguard's labels off every Node.
func (o *cleanupOptions) cleanNodeLabels(ctx context.Context, out io.Writer, kube kubernetes.Interface, verb string) []error {
	nodes, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return []error{fmt.Errorf("listing nodes: %w", err)}
	}
	var failed []error
	for _, n := range nodes.Items {
		var keys []string
		for k := range n.Labels {
			if isAgentLabel(k) {
				keys = append(keys, k)
			}
		}
		if len(keys) == 0 {
			continue
		}
		sort.Strings(keys)
		if !o.dryRun {
			remove := map[string]any{}
			for _, k := range keys {
				remove[k] = nil
			}
			patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": remove}})
			if _, err := kube.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
				failed = append(failed, fmt.Errorf("removing labels from node %s: %w", n.Name, err))
				continue
			}
		}
		fmt.Fprintf(out, "%s labels %s from node %s\n", verb, strings.Join(keys, ", "), n.Name)
	}
	return failed
}

// isAgentLabel: a label the agents publish on their Node.
func isAgentLabel(k string) bool {
	return k == wellknown.HardenedLabel || k == wellknown.HardenedMarkLabel || strings.HasPrefix(k, wellknown.CheckLabelPrefix)
}

// cleanLeases deletes the node enforcers' and the audit's Leases.
func (o *cleanupOptions) cleanLeases(ctx context.Context, out io.Writer, kube kubernetes.Interface, verb string) []error {
	leases, err := kube.CoordinationV1().Leases(o.namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return []error{fmt.Errorf("listing Leases in %s: %w", o.namespace, err)}
	}
	var failed []error
	for _, l := range leases.Items {
		if !strings.HasPrefix(l.Name, wellknown.EnforcerLeasePrefix) && l.Name != wellknown.AuditLease {
			continue
		}
		if !o.dryRun {
			err := kube.CoordinationV1().Leases(o.namespace).Delete(ctx, l.Name, metav1.DeleteOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				failed = append(failed, fmt.Errorf("deleting Lease %s/%s: %w", o.namespace, l.Name, err))
				continue
			}
		}
		fmt.Fprintf(out, "%s Lease %s/%s\n", verb, o.namespace, l.Name)
	}
	return failed
}
