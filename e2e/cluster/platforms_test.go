//go:build e2e

package cluster

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuguard/gpuguard/e2e/framework"
	"github.com/gpuguard/gpuguard/testsupport/platforms"
)

// platformReleaseNS is where each platform's release goes, one at a time.
const platformReleaseNS = "gpuguard-platforms"

// simulatedAnnotation marks the nodes that KWOK keeps alive: the platforms'
// nodes, never the suite's real node.
const simulatedAnnotation = "kwok.x-k8s.io/node"

// TestPlatformProfilesInstall installs the chart, as published, once per
// platform profile with `platform=<p>` and nothing else (what
// docs/platforms.md asks to set by hand, the page's nodes' labels and the
// `nvidia` RuntimeClass, the test creates as the platform would), on a
// cluster holding the platform's GPU and CPU nodes (testsupport/platforms:
// their labels and taints, and only the RuntimeClasses the platform has).
// KWOK keeps those nodes Ready and runs the pods bound to them. The real
// DaemonSet controller, RuntimeClass admission and scheduler then decide:
// helm install --wait succeeds, every GPU node has one Running agent pod, and
// no other node has one. A profile that names a RuntimeClass its platform
// lacks fails here, where the chart tests' placement simulation cannot see
// it: the API server refuses the agent's pods.
func TestPlatformProfilesInstall(t *testing.T) {
	ctx := context.Background()
	startPlatformKWOK(t)
	sh := newShell(t)
	t.Cleanup(func() {
		_ = s.cp.Client.CoreV1().Namespaces().Delete(ctx, platformReleaseNS, metav1.DeleteOptions{})
	})
	for _, name := range slices.Sorted(maps.Keys(platforms.All)) {
		platform := platforms.All[name]
		t.Run(name, func(t *testing.T) {
			ensureRuntimeClasses(t, platform.RuntimeClasses)
			gpu := createPlatformNodes(t, name, "gpu", platform.GPU)
			cpu := createPlatformNodes(t, name, "cpu", platform.CPU)
			waitNodesReady(t, append(slices.Clone(gpu), cpu...))

			install := fmt.Sprintf("helm install gpuguard oci://$REGISTRY/charts/gpuguard -n %s --create-namespace --wait --timeout 3m --set platform=%s",
				platformReleaseNS, name)
			out, err := sh.run(install)
			t.Cleanup(func() {
				if out, err := sh.run("helm uninstall gpuguard -n " + platformReleaseNS + " --wait"); err != nil {
					t.Errorf("helm uninstall: %v\n%s", err, out)
				}
				// The next platform's release, and the suite's next test,
				// start where the garbage collector has removed what the
				// webhook registered at run time.
				nothingLeftBlocking(t)
			})
			if err != nil {
				t.Fatalf("%s: %v\n%s\nthe agent DaemonSet's events:\n%s", install, err, out, agentEvents())
			}
			agentOnExactly(t, gpu)
		})
	}
}

// startPlatformKWOK starts KWOK for the annotated nodes alone: the suite's
// node has a real kubelet, which KWOK must leave alone.
func startPlatformKWOK(t *testing.T) {
	kubeconfig, err := s.cp.Kubeconfig("kwok")
	if err != nil {
		t.Fatal(err)
	}
	d, err := framework.StartDaemon("kwok-platforms", s.cp.Dir(), nil, filepath.Join(s.assets, "kwok"),
		"--kubeconfig", kubeconfig, "--config", filepath.Join(s.assets, "kwok-stages.yaml"),
		"--manage-all-nodes=false", "--manage-nodes-with-annotation-selector="+simulatedAnnotation+"=fake",
		"--node-lease-duration-seconds=40", "--server-address=127.0.0.1:0",
		// Pod addresses away from the suite's pod and service networks.
		"--cidr=10.123.0.1/24")
	if err != nil {
		t.Fatalf("%v (make upstream builds KWOK and its stages)", err)
	}
	t.Cleanup(func() {
		if err := d.Stop(10 * time.Second); err != nil {
			t.Errorf("stopping KWOK: %v", err)
		}
	})
}

// ensureRuntimeClasses leaves the cluster with the `nvidia` RuntimeClass
// exactly when the platform has it; what it creates goes at cleanup.
func ensureRuntimeClasses(t *testing.T, want []string) {
	ctx := context.Background()
	rcs := s.cp.Client.NodeV1().RuntimeClasses()
	for _, name := range want {
		if name != platforms.NVIDIARuntimeClass {
			t.Fatalf("RuntimeClass %s: only %s is simulated", name, platforms.NVIDIARuntimeClass)
		}
		rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Handler: name}
		if _, err := rcs.Create(ctx, rc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = rcs.Delete(ctx, name, metav1.DeleteOptions{}) })
	}
	if len(want) == 0 {
		if _, err := rcs.Get(ctx, platforms.NVIDIARuntimeClass, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("RuntimeClass %s: %v, want none on this platform (left by an earlier test?)", platforms.NVIDIARuntimeClass, err)
		}
	}
}

// createPlatformNodes creates the platform's nodes as KWOK's, with the
// labels every kubelet sets besides the platform's, and returns their names;
// they go at cleanup. They are cordoned: the release's Deployments and hook
// Jobs then run on the suite's real node, where their pods really serve,
// while the agent's DaemonSet pods are placed as on an uncordoned node (the
// DaemonSet controller gives them the node.kubernetes.io/unschedulable
// toleration), by the platform's labels and taints alone.
func createPlatformNodes(t *testing.T, platform, kind string, nodes []platforms.Node) []string {
	ctx := context.Background()
	capacity := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("32"),
		corev1.ResourceMemory: resource.MustParse("128Gi"), corev1.ResourcePods: resource.MustParse("110")}
	var names []string
	for _, n := range nodes {
		name := fmt.Sprintf("%s-%s-%s", platform, kind, n.Name)
		labels := map[string]string{"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
		maps.Copy(labels, n.Labels)
		node := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: map[string]string{simulatedAnnotation: "fake"}},
			Spec:       corev1.NodeSpec{Taints: n.Taints, Unschedulable: true},
			Status:     corev1.NodeStatus{Capacity: capacity, Allocatable: capacity},
		}
		if _, err := s.cp.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.cp.Client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}) })
		names = append(names, name)
	}
	return names
}

func waitNodesReady(t *testing.T, names []string) {
	ctx := context.Background()
	notReady := names
	err := framework.Poll(ctx, time.Minute, func() (bool, error) {
		notReady = slices.DeleteFunc(slices.Clone(names), func(name string) bool {
			n, err := s.cp.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			return err == nil && slices.ContainsFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool {
				return c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue
			})
		})
		return len(notReady) == 0, nil
	})
	if err != nil {
		t.Fatalf("KWOK made nodes %v not Ready: %v", notReady, err)
	}
}

// agentOnExactly checks that the agent's DaemonSet has one Running pod on
// each of gpuNodes and none on any other node.
func agentOnExactly(t *testing.T, gpuNodes []string) {
	ctx := context.Background()
	pods, err := s.cp.Client.CoreV1().Pods(platformReleaseNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	running := map[string]int{}
	for _, p := range pods.Items {
		if !ownedByDaemonSet(p) {
			continue
		}
		if p.Status.Phase != corev1.PodRunning {
			t.Errorf("agent pod %s on node %q is %s, want Running", p.Name, p.Spec.NodeName, p.Status.Phase)
		}
		running[p.Spec.NodeName]++
	}
	for _, n := range gpuNodes {
		if running[n] != 1 {
			t.Errorf("GPU node %s has %d agent pods, want 1\nthe agent DaemonSet's events:\n%s", n, running[n], agentEvents())
		}
		delete(running, n)
	}
	for n, count := range running {
		t.Errorf("node %s, not a GPU node of the platform, has %d agent pods", n, count)
	}
}

func ownedByDaemonSet(p corev1.Pod) bool {
	return slices.ContainsFunc(p.OwnerReferences, func(o metav1.OwnerReference) bool { return o.Kind == "DaemonSet" })
}

// agentEvents are the Events of the release's DaemonSets, where the
// DaemonSet controller says why it could not create a pod (FailedCreate: a
// RuntimeClass not found, say). Earlier platforms' releases had DaemonSets
// of the same name: only this one's count.
func agentEvents() string {
	ctx := context.Background()
	daemonSets, err := s.cp.Client.AppsV1().DaemonSets(platformReleaseNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	var lines []string
	for _, ds := range daemonSets.Items {
		evs, err := s.cp.Client.CoreV1().Events(platformReleaseNS).List(ctx,
			metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(ds.UID)})
		if err != nil {
			return err.Error()
		}
		for _, e := range evs.Items {
			lines = append(lines, fmt.Sprintf("  %s %s: %s", e.Reason, ds.Name, e.Message))
		}
	}
	sort.Strings(lines)
	return strings.Join(slices.Compact(lines), "\n")
}
