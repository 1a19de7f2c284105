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
	// values, when given, render the candidate from the Helm chart: the
	// policy an install or upgrade with them would put in force.
	values chartValues
	// mode, when set, overrides the policy's mode, as check --mode does.
	mode     string
	excluded []string
	stderr   io.Writer
}

func newAuditCommand() *cobra.Command {
	o := &auditOptions{}
	cmd := &cobra.Command{
		Use:   "audit [-A | -n NAMESPACE] [--policy FILE | --values FILE...] [--mode enforce|warn|audit] [-o text|json|sarif] [-q] [--kubeconfig FILE]",
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

--policy judges with a candidate policy file instead, and --values (and --set)
with the policy the Helm chart installs with those values (gpuguard policy
--values prints it): what an install or upgrade would deny, before it is made.
--mode judges as if the policy were in that mode (enforce shows what warn and
audit let through).

Exit status: 0 when nothing is denied, 1 when anything is, 2 for usage, access or
policy errors.`,
		Example: `  gpuguard audit -A
  gpuguard audit -n ml-team -o json
  gpuguard audit -A --policy-configmap gpuguard-system/gpuguard-policy
  gpuguard audit -A --policy candidate.yaml   # preview a policy before applying it
  gpuguard audit -A --values values.yaml      # the policy helm install -f values.yaml installs
  gpuguard audit -A --mode enforce            # what enforce would deny of what runs`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.values.stdin = cmd.InOrStdin()
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
	o.values.addFlags(fl)
	fl.StringVar(&o.mode, "mode", "", "judge as if the policy's mode were this: enforce, warn or audit")
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
	p, policyNS, err := o.policyToJudgeWith(ctx, c)
	if err != nil {
		return err
	}
	if err := overrideMode(p, o.mode); err != nil {
		return err
	}
	engine, err := policy.New(p)
	if err != nil {
		return &exitError{exitUsage, err.Error()}
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

// policyToJudgeWith is the candidate policy (--policy, --values), else the
// live one in the policy ConfigMap; it returns the ConfigMap's namespace,
// which the chart leaves unguarded.
func (o *auditOptions) policyToJudgeWith(ctx context.Context, c kubernetes.Interface) (*config.Policy, string, error) {
	ns, name, ok := strings.Cut(o.policyConfigMap, "/")
	if !ok || ns == "" || name == "" {
		return nil, "", &exitError{exitUsage, fmt.Sprintf("--policy-configmap %q: want NAMESPACE/NAME", o.policyConfigMap)}
	}
	switch {
	case o.policyFile != "" && o.values.given():
		return nil, "", &exitError{exitUsage, "--policy and --values both name the candidate policy: use one"}
	case o.values.given():
		p, _, err := o.values.policy()
		return p, ns, err
	case o.policyFile != "":
		p, err := config.ReadFile(o.policyFile)
		if err != nil {
			return nil, "", &exitError{exitUsage, "--policy: " + err.Error()}
		}
		return p, ns, nil
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
	return p, ns, nil
}
