//go:build e2e

package node

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	cri "k8s.io/cri-api/pkg/apis"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	remote "k8s.io/cri-client/pkg"

	"github.com/gpuguard/gpuguard/e2e/framework"
	"github.com/gpuguard/gpuguard/e2e/framework/kubenode"
)

const gpuResource = "nvidia.com/gpu"

var podSeq atomic.Int32

// probePod is a probe pod with a unique name.
func probePod(prefix string) *corev1.Pod {
	return s.node.ProbePod(fmt.Sprintf("%s-%d", prefix, podSeq.Add(1)))
}

// gpuPod is a probe pod requesting one GPU.
func gpuPod(prefix string) *corev1.Pod { return limitPod(prefix, gpuResource) }

// limitPod is a probe pod requesting one of an extended resource.
func limitPod(prefix string, r corev1.ResourceName) *corev1.Pod {
	p := probePod(prefix)
	one := resource.MustParse("1")
	p.Spec.Containers[0].Resources = corev1.ResourceRequirements{
		Limits: corev1.ResourceList{r: one}, Requests: corev1.ResourceList{r: one}}
	return p
}

func withEnv(p *corev1.Pod, name, value string) *corev1.Pod {
	c := &p.Spec.Containers[0]
	c.Env = append(c.Env, corev1.EnvVar{Name: name, Value: value})
	return p
}

func withAnnotation(p *corev1.Pod, key, value string) *corev1.Pod {
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations[key] = value
	return p
}

// probe runs a pod to completion and returns what its container saw and
// the pod as stored; the pod is deleted afterwards.
func probe(t *testing.T, ns string, p *corev1.Pod) (kubenode.ProbeReport, *corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	report, done, err := s.node.RunProbe(ctx, ns, p)
	if done != nil || err == nil {
		t.Cleanup(func() { _ = s.node.DeletePod(ctx, ns, p.Name) })
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s/%s saw GPUs %v, NVIDIA_VISIBLE_DEVICES=%q, device list %v", ns, p.Name, report.GPUs(), report.Env["NVIDIA_VISIBLE_DEVICES"], report.DeviceListFiles)
	return report, done
}

// allGPUs are the container paths of every fake GPU.
func allGPUs() []string {
	var out []string
	for _, g := range s.node.GPUs {
		out = append(out, g.Container)
	}
	slices.Sort(out)
	return out
}

func expectGPUs(t *testing.T, got kubenode.ProbeReport, want []string) {
	t.Helper()
	if !slices.Equal(got.GPUs(), want) {
		t.Errorf("the container saw GPUs %v, want %v (devices %v, env %v)", got.GPUs(), want, got.Devices, got.Env)
	}
}

// expectAllocatedOnly checks that a one-GPU pod saw exactly the device the
// kubelet allocated to it, and returns that device.
func expectAllocatedOnly(t *testing.T, report kubenode.ProbeReport, pod *corev1.Pod) kubenode.FakeGPU {
	t.Helper()
	return expectAllocatedOnlyOf(t, report, pod, gpuResource)
}

// expectAllocatedOnlyOf: the pod's container saw exactly the GPU of the one
// device of resource the kubelet allocated to it (a MIG device's parent).
func expectAllocatedOnlyOf(t *testing.T, report kubenode.ProbeReport, pod *corev1.Pod, resource string) kubenode.FakeGPU {
	t.Helper()
	ids, err := s.node.AllocatedDevices(string(pod.UID), pod.Spec.Containers[0].Name, resource)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 1 {
		t.Fatalf("the kubelet allocated %v of %s to %s, want one device", ids, resource, pod.Name)
	}
	g, ok := s.node.GPUByID(ids[0])
	if !ok {
		t.Fatalf("allocated device %q is none of the node's GPUs", ids[0])
	}
	expectGPUs(t, report, []string{g.Container})
	return g
}

// lastEnv is the effective value of a variable in a stored container spec.
func lastEnv(c corev1.Container, name string) string { return framework.LastEnv(c, name) }

// expectDenied fails unless err is a gpuguard denial naming rule.
func expectDenied(t *testing.T, err error, rule string) {
	t.Helper()
	rules, notDenial := framework.DeniedRules(err)
	if notDenial != nil {
		t.Fatalf("%v (want a denial by %s)", notDenial, rule)
	}
	if !slices.Contains(rules, rule) {
		t.Errorf("denial does not name rule %s: %v", rule, err)
	}
}

// create tries to create a pod and deletes it if it was admitted.
func create(t *testing.T, ns string, p *corev1.Pod) error {
	t.Helper()
	_, _, err := s.node.RunProbe(context.Background(), ns, p)
	if err == nil || !apierrors.IsForbidden(err) {
		_ = s.node.DeletePod(context.Background(), ns, p.Name)
	}
	return err
}

func apply(t *testing.T, p kubenode.NodeProfile) {
	t.Helper()
	if err := s.node.Apply(context.Background(), p); err != nil {
		t.Fatalf("configuring the node (%s): %v\n%s", p, err, s.node.LogTails())
	}
}

// heldSandbox is a running pod's sandbox at the node's containerd, for
// creating containers in it directly over CRI, as the kubelet does.
type heldSandbox struct {
	runtime cri.RuntimeService
	id      string
	config  *runtimeapi.PodSandboxConfig
}

// startHeldSandbox starts a held probe pod through the kubelet and finds
// its sandbox: the kubelet stops sandboxes it does not know, and the
// enforcer reads the pod's allocation from it. The pod is deleted when
// stop is called.
func startHeldSandbox(ctx context.Context, prefix, logDir string) (sb *heldSandbox, stop func(), err error) {
	rs, err := remote.NewRemoteRuntimeServiceBuilder().WithEndpoint("unix://" + s.node.ContainerdSocket()).
		WithConnectionTimeout(10 * time.Second).WithTracerProvider(nil).Build(ctx)
	if err != nil {
		return nil, nil, err
	}
	pod, err := s.node.StartHeldProbe(ctx, tenantNS, probePod(prefix))
	if err != nil {
		return nil, nil, err
	}
	stop = func() { _ = s.node.DeletePod(ctx, tenantNS, pod.Name) }
	sandboxes, err := rs.ListPodSandbox(ctx, &runtimeapi.PodSandboxFilter{
		LabelSelector: map[string]string{"io.kubernetes.pod.uid": string(pod.UID)},
		State:         &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY}})
	if err != nil || len(sandboxes) != 1 {
		stop()
		return nil, nil, fmt.Errorf("the sandbox of %s: %v (%d found)", pod.Name, err, len(sandboxes))
	}
	// Each container gets a log path, as the kubelet gives it: removing a
	// container it does not know, the kubelet deletes every file matching
	// its log path plus "*", which for a container without one is every
	// file of the kubelet's working directory.
	return &heldSandbox{runtime: rs, id: sandboxes[0].Id, config: &runtimeapi.PodSandboxConfig{
		Metadata: sandboxes[0].Metadata, Labels: sandboxes[0].Labels, LogDirectory: filepath.Join(s.node.Root, logDir)}}, stop, nil
}

// create creates a container of image named name in the sandbox.
func (sb *heldSandbox) create(ctx context.Context, name, image string) (string, error) {
	return sb.runtime.CreateContainer(ctx, sb.id, &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: name},
		Image:    &runtimeapi.ImageSpec{Image: image},
		LogPath:  name + ".log",
	}, sb.config)
}
