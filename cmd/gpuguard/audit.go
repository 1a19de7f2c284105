package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/internal/audit"
	"github.com/gpuguard/gpuguard/internal/kubeconfig"
	"github.com/gpuguard/gpuguard/policy"
)

type auditOptions struct {
	kube            kubeconfig.Flags
	namespace       string
	allNamespaces   bool
	out             outputOptions
	policyConfigMap string
	// policyFile, when set, is a candidate policy judged with instead of
	// the live one: a preview of its denials before it is applied.
	policyFile string
	excluded   []string
	stderr     io.Writer
}

func newAuditCommand() *cobra.Command {
	o := &auditOptions{}
	cmd := &cobra.Command{
		Use:   "audit [-A | -n NAMESPACE] [-o text|json|sarif] [-q] [--kubeconfig FILE]",
		Short: "Judge what already runs in a cluster with the live policy",
		Long: `audit judges every existing pod and pod controller of a cluster with the policy
in force (the policy ConfigMap the webhook reads), with check's output: what
admission could not judge because it came before gpuguard, during a webhook
outage, or before a policy change.

An existing pod is judged as it is stored: a container without GPU resources and
without NVIDIA_VISIBLE_DEVICES=void is a violation (final-state), not a mutation
to come. Pods that have finished, and ReplicaSets and Jobs that a Deployment or
CronJob owns (their owner is judged), are left out; so are kube-system,
kube-node-lease and the policy's own namespace, which the chart leaves unguarded.

Exit status: 0 when nothing is denied, 1 when anything is, 2 for usage, access or
policy errors.`,
		Example: `  gpuguard audit -A
  gpuguard audit -n ml-team -o json
  gpuguard audit -A --policy-configmap gpuguard-system/gpuguard-policy
  gpuguard audit -A --policy candidate.yaml   # preview a policy before applying it`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	fl := cmd.Flags()
	o.kube.AddFlags(fl)
	fl.StringVarP(&o.namespace, "namespace", "n", "", "the namespace to audit")
	fl.BoolVarP(&o.allNamespaces, "all-namespaces", "A", false, "audit every namespace")
	o.out.addFlags(fl)
	fl.StringVar(&o.policyConfigMap, "policy-configmap", "gpuguard/gpuguard-policy", "NAMESPACE/NAME of the policy ConfigMap (key policy.yaml)")
	fl.StringVar(&o.policyFile, "policy", "", "judge with this candidate policy file instead of the live one, to preview what it would deny before applying it (the ConfigMap's namespace is still left out)")
	fl.StringSliceVar(&o.excluded, "exclude-namespace", audit.DefaultExcluded, "namespaces left out, besides the policy's own")
	return cmd
}

func (o *auditOptions) run(ctx context.Context, stdout, stderr io.Writer) error {
	if ctx == nil {
		ctx = context.Background()
	}
	o.stderr = stderr
	switch {
	case o.out.validate() != nil:
		return o.out.validate()
	case o.allNamespaces == (o.namespace != ""):
		return &exitError{exitUsage, "say which namespaces: -A for all, or -n NAMESPACE"}
	}
	cfg, err := o.kube.Load()
	if err != nil {
		return &exitError{exitUsage, err.Error()}
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return &exitError{exitUsage, err.Error()}
	}
	return o.audit(ctx, client, stdout)
}

// audit judges the objects of the chosen namespaces and writes the results.
func (o *auditOptions) audit(ctx context.Context, c kubernetes.Interface, stdout io.Writer) error {
	engine, policyNS, err := o.livePolicy(ctx, c)
	if err != nil {
		return err
	}
	out, err := audit.Run(ctx, c, engine, audit.Options{Namespace: o.namespace, Excluded: append(slices.Clone(o.excluded), policyNS)})
	if err != nil {
		return &exitError{exitUsage, err.Error()}
	}
	results := make([]checkedObject, 0, len(out.Judged))
	for _, j := range out.Judged {
		results = append(results, newCheckedObject(j.APIVersion, j.Kind, j.Meta.GetNamespace(), j.Meta.GetName(), "cluster", j.Result))
	}
	return o.out.write(stdout, o.stderr, results, out.Skipped)
}

// livePolicy reads the policy ConfigMap and builds the engine; it returns
// the ConfigMap's namespace, which the chart leaves unguarded.
func (o *auditOptions) livePolicy(ctx context.Context, c kubernetes.Interface) (*policy.Engine, string, error) {
	ns, name, ok := strings.Cut(o.policyConfigMap, "/")
	if !ok || ns == "" || name == "" {
		return nil, "", &exitError{exitUsage, fmt.Sprintf("--policy-configmap %q: want NAMESPACE/NAME", o.policyConfigMap)}
	}
	if o.policyFile != "" {
		p, err := config.ReadFile(o.policyFile)
		if err != nil {
			return nil, "", &exitError{exitUsage, "--policy: " + err.Error()}
		}
		e, err := policy.New(p)
		if err != nil {
			return nil, "", &exitError{exitUsage, "--policy: " + err.Error()}
		}
		return e, ns, nil
	}
	cm, err := c.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, "", &exitError{exitUsage, fmt.Sprintf("policy ConfigMap %s not found: is gpuguard installed there? Pass --policy-configmap NAMESPACE/NAME", o.policyConfigMap)}
	}
	if err != nil {
		return nil, "", &exitError{exitUsage, fmt.Sprintf("reading the policy ConfigMap %s: %v", o.policyConfigMap, err)}
	}
	doc, ok := cm.Data[config.ConfigMapKey]
	if !ok {
		return nil, "", &exitError{exitUsage, fmt.Sprintf("policy ConfigMap %s has no key %s", o.policyConfigMap, config.ConfigMapKey)}
	}
	p, err := config.Parse(o.policyConfigMap, []byte(doc))
	if err != nil {
		return nil, "", &exitError{exitUsage, "invalid policy:\n" + err.Error()}
	}
	e, err := policy.New(p)
	if err != nil {
		return nil, "", &exitError{exitUsage, err.Error()}
	}
	return e, ns, nil
}
