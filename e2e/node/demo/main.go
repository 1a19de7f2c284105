// Command demo shows the GPU leak on a real node and gpuguard closing it:
// it starts a control plane and a node (kubelet, containerd, the NVIDIA
// Container Runtime, fake GPUs; see docs/node-e2e.md), runs the same pods
// in a namespace gpuguard does not cover and in one it does, and prints
// what each container could open. Needs root.
//
//	make demo-node     # or: go run ./e2e/node/demo
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/e2e/framework"
	"github.com/gpuguard/gpuguard/e2e/framework/controlplane"
	"github.com/gpuguard/gpuguard/e2e/framework/kubenode"
)

const (
	unguardedNS = "unguarded"
	guardedNS   = "guarded"
)

// row is one pod shape, run on one node configuration.
type row struct {
	what    string
	profile kubenode.NodeProfile
	pod     func(n *kubenode.Node, name string) *corev1.Pod
}

var (
	typical     = kubenode.NodeProfile{Strategy: "envvar"}
	passthrough = kubenode.NodeProfile{Hardened: true, Strategy: "cdi-cri", PodAnnotations: []string{"cdi.k8s.io/*"}}
)

func rows() []row {
	return []row{
		{"no GPU request, CUDA-style image (ENV NVIDIA_VISIBLE_DEVICES=all)", typical, plain},
		{"no GPU request, env NVIDIA_VISIBLE_DEVICES=all", typical, env(plain, "all")},
		{"1 GPU requested", typical, oneGPU},
		{"1 GPU requested, env NVIDIA_VISIBLE_DEVICES=all", typical, env(oneGPU, "all")},
		{"no GPU request, annotation cdi.k8s.io/x: nvidia.com/gpu=all", passthrough, cdiAnnotation},
	}
}

func plain(n *kubenode.Node, name string) *corev1.Pod { return n.ProbePod(name) }

func oneGPU(n *kubenode.Node, name string) *corev1.Pod {
	p := n.ProbePod(name)
	one := resource.MustParse("1")
	p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": one}
	return p
}

func env(base func(*kubenode.Node, string) *corev1.Pod, value string) func(*kubenode.Node, string) *corev1.Pod {
	return func(n *kubenode.Node, name string) *corev1.Pod {
		p := base(n, name)
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: value}}
		return p
	}
}

func cdiAnnotation(n *kubenode.Node, name string) *corev1.Pod {
	p := n.ProbePod(name)
	p.Annotations = map[string]string{"cdi.k8s.io/x": kubenode.CDIKind + "=all"}
	return p
}

func main() {
	if err := kubenode.NodeReadiness(); err != nil {
		fmt.Fprintln(os.Stderr, "demo-node: this machine cannot run a node:", err)
		os.Exit(1)
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo-node:", err)
		os.Exit(1)
	}
}

func run() error {
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	assets := filepath.Join(root, "_output", "bin")
	if err := kubenode.CheckNodeBinaries(assets); err != nil {
		return err
	}
	version, err := framework.ToolkitVersion(root)
	if err != nil {
		return err
	}
	ctx := context.Background()
	fmt.Println("starting etcd, kube-apiserver, containerd, kubelet and gpuguard-agent …")
	cp, err := controlplane.StartControlPlane(assets)
	if err != nil {
		return err
	}
	defer cp.Stop()
	node, err := kubenode.StartNode(ctx, cp, kubenode.NodeOptions{Name: "gpu-node-1", RepoRoot: root, Assets: assets, ToolkitVersion: version})
	if err != nil {
		return err
	}
	defer node.Stop(ctx)
	for _, ns := range []string{unguardedNS, guardedNS} {
		if err := controlplane.EnsureNamespace(ctx, cp, ns, nil); err != nil {
			return err
		}
	}
	fmt.Println("installing gpuguard with the default policy (namespace", unguardedNS, "left out) …")
	in, err := controlplane.Install(ctx, cp, root, "gpuguard", string(config.DefaultYAML()), unguardedNS)
	if err != nil {
		return err
	}
	defer in.Uninstall(ctx, cp)
	if err := controlplane.WaitEnforcing(ctx, cp.Client, guardedNS, time.Minute); err != nil {
		return err
	}
	return table(ctx, node)
}

func table(ctx context.Context, node *kubenode.Node) error {
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "pod\tnode\twithout gpuguard\twith gpuguard\tverifier (admission bypassed)\n")
	var applied *kubenode.NodeProfile
	for i, r := range rows() {
		if applied == nil || applied.String() != r.profile.String() {
			fmt.Printf("configuring the node: %s …\n", r.profile)
			if err := node.Apply(ctx, r.profile); err != nil {
				return err
			}
			applied = &r.profile
		}
		without, err := outcome(ctx, node, unguardedNS, r.pod(node, fmt.Sprintf("pod-%d", i)))
		if err != nil {
			return err
		}
		with, err := outcome(ctx, node, guardedNS, r.pod(node, fmt.Sprintf("pod-%d", i)))
		if err != nil {
			return err
		}
		seen, err := verifierSees(ctx, node, unguardedNS, r.pod(node, fmt.Sprintf("pod-%d-running", i)))
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", r.what, r.profile, without, with, seen)
	}
	fmt.Println()
	return w.Flush()
}

// outcome runs a pod and says what its container could open.
func outcome(ctx context.Context, node *kubenode.Node, ns string, pod *corev1.Pod) (string, error) {
	report, _, err := node.RunProbe(ctx, ns, pod)
	defer func() { _ = node.DeletePod(ctx, ns, pod.Name) }()
	var status apierrors.APIStatus
	if errors.As(err, &status) && apierrors.IsForbidden(err) {
		return "denied at admission", nil
	}
	if err != nil {
		return "", err
	}
	switch gpus := report.GPUs(); len(gpus) {
	case 0:
		return "no GPU", nil
	case len(node.GPUs):
		return fmt.Sprintf("all %d GPUs", len(gpus)), nil
	default:
		return strings.Join(gpus, " "), nil
	}
}

// verifierSees keeps the pod running where admission does not look, and says
// what the agent's verifier reports about it within two of its passes.
func verifierSees(ctx context.Context, node *kubenode.Node, ns string, pod *corev1.Pod) (string, error) {
	_, err := node.StartHeldProbe(ctx, ns, pod)
	defer func() { _ = node.DeletePod(ctx, ns, pod.Name) }()
	if err != nil {
		return "", err
	}
	const passes = `gpuguard_agent_verify_passes_total{result="ok"}`
	series := fmt.Sprintf(`gpuguard_agent_unallocated_gpu_access{container=%q,namespace=%q,pod=%q}`, pod.Spec.Containers[0].Name, ns, pod.Name)
	m, err := node.AgentMetrics(ctx)
	if err != nil {
		return "", err
	}
	start := m[passes]
	err = framework.Poll(ctx, 30*time.Second, func() (bool, error) {
		m, err = node.AgentMetrics(ctx)
		return err == nil && (m[series] > 0 || m[passes] >= start+2), nil
	})
	if err != nil {
		return "", fmt.Errorf("the verifier made no pass: %w", err)
	}
	if n := m[series]; n > 0 {
		return fmt.Sprintf("found: %d GPUs not allocated", int(n)), nil
	}
	return "nothing to find", nil
}
