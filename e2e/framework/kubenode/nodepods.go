package kubenode

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuguard/gpuguard/e2e/framework"
)

// ProbeReport is what the probe container saw (see images/probe).
type ProbeReport struct {
	Env             map[string]string `json:"env"`
	DeviceListFiles []string          `json:"deviceListFiles"`
	Devices         []string          `json:"devices"`
	// Groups are the process's groups, the primary one first.
	Groups []int `json:"groups"`
	// Connect is "ok" when the probe could connect to PROBE_CONNECT, else
	// the error.
	Connect string `json:"connect,omitempty"`
}

var gpuNode = regexp.MustCompile(`^/dev/nvidia[0-9]+$`)

// GPUs are the GPU device nodes the container could open, sorted.
func (r ProbeReport) GPUs() []string {
	var out []string
	for _, d := range r.Devices {
		if gpuNode.MatchString(d) {
			out = append(out, d)
		}
	}
	slices.Sort(out)
	return out
}

// ProbePod is a pod running the probe image on this node, shaped for a node
// without CNI, scheduler or service account tokens.
func (n *Node) ProbePod(name string) *corev1.Pod {
	noToken := false
	zero := int64(0)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			NodeName:                      n.Name,
			HostNetwork:                   true,
			AutomountServiceAccountToken:  &noToken,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &zero,
			Containers: []corev1.Container{{
				Name: "probe", Image: ProbeImage, ImagePullPolicy: corev1.PullNever,
			}},
		},
	}
}

// RunProbe creates the pod, waits until its probe container has ended and
// returns what it saw, with the pod as it was then. A creation error (such
// as an admission denial) is returned as it is.
func (n *Node) RunProbe(ctx context.Context, ns string, pod *corev1.Pod) (ProbeReport, *corev1.Pod, error) {
	pods := n.cp.Client.CoreV1().Pods(ns)
	created, err := pods.Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return ProbeReport{}, nil, err
	}
	var done *corev1.Pod
	err = framework.Poll(ctx, 2*time.Minute, func() (bool, error) {
		p, err := pods.Get(ctx, created.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		done = p
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed, nil
	})
	if err != nil {
		return ProbeReport{}, done, fmt.Errorf("pod %s/%s did not finish: %w\nstatus: %s\n%s", ns, pod.Name, err, statusJSON(done), n.LogTails())
	}
	report, err := probeReport(done)
	if err != nil {
		return ProbeReport{}, done, fmt.Errorf("pod %s/%s: %w\nstatus: %s\n%s", ns, pod.Name, err, statusJSON(done), n.LogTails())
	}
	return report, done, nil
}

// RunProbeContainer creates the pod, waits until its container (or init
// container) named container has ended (the pod's other containers may hold) and returns
// what that container saw, with the pod as it was then.
func (n *Node) RunProbeContainer(ctx context.Context, ns string, pod *corev1.Pod, container string) (ProbeReport, *corev1.Pod, error) {
	pods := n.cp.Client.CoreV1().Pods(ns)
	created, err := pods.Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return ProbeReport{}, nil, err
	}
	var done *corev1.Pod
	var ended *corev1.ContainerStateTerminated
	err = framework.Poll(ctx, 2*time.Minute, func() (bool, error) {
		p, err := pods.Get(ctx, created.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		done = p
		for _, cs := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
			if cs.Name == container && cs.State.Terminated != nil {
				ended = cs.State.Terminated
			}
		}
		return ended != nil, nil
	})
	if err != nil {
		return ProbeReport{}, done, fmt.Errorf("container %s of pod %s/%s did not end: %w\nstatus: %s\n%s", container, ns, pod.Name, err, statusJSON(done), n.LogTails())
	}
	var r ProbeReport
	if ended.ExitCode != 0 {
		return r, done, fmt.Errorf("container %s of pod %s/%s exited %d\nstatus: %s", container, ns, pod.Name, ended.ExitCode, statusJSON(done))
	}
	return r, done, json.Unmarshal([]byte(ended.Message), &r)
}

func probeReport(p *corev1.Pod) (ProbeReport, error) {
	var r ProbeReport
	for _, cs := range p.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil && t.ExitCode == 0 {
			return r, json.Unmarshal([]byte(t.Message), &r)
		}
	}
	return r, fmt.Errorf("the probe did not complete (phase %s)", p.Status.Phase)
}

func statusJSON(p *corev1.Pod) string {
	if p == nil {
		return "<none>"
	}
	data, _ := json.Marshal(p.Status)
	return string(data)
}

// DeletePod deletes a pod at once; the kubelet then stops its sandbox.
func (n *Node) DeletePod(ctx context.Context, ns, name string) error {
	zero := int64(0)
	return n.cp.Client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
}

// DeleteAllPods deletes every pod bound to the node; one already gone (its
// controller deleted it meanwhile) is no error.
func (n *Node) DeleteAllPods(ctx context.Context) error {
	list, err := n.cp.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name})
	if err != nil {
		return err
	}
	for _, p := range list.Items {
		if err := n.DeletePod(ctx, p.Namespace, p.Name); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return nil
}

// AllocatedDevices returns the device IDs the kubelet allocated to a pod's
// container for resource, from the device manager's checkpoint: what the
// agent was asked for, independent of what reached the container.
func (n *Node) AllocatedDevices(podUID, container, resource string) ([]string, error) {
	data, err := os.ReadFile(filepath.Join(n.DevicePluginDir(), "kubelet_internal_checkpoint"))
	if err != nil {
		return nil, err
	}
	var cp struct {
		Data struct {
			PodDeviceEntries []struct {
				PodUID, ContainerName, ResourceName string
				DeviceIDs                           map[string][]string
			}
		}
	}
	if err := json.Unmarshal(data, &cp); err != nil {
		return nil, fmt.Errorf("reading the kubelet's device checkpoint: %w", err)
	}
	var ids []string
	for _, e := range cp.Data.PodDeviceEntries {
		if e.PodUID == podUID && e.ContainerName == container && e.ResourceName == resource {
			for _, perNUMA := range e.DeviceIDs {
				ids = append(ids, perNUMA...)
			}
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// GPUByID finds a fake GPU by the ID the kubelet allocated: its UUID or
// index, a time-sliced share of it ("<UUID>::<n>"), or one of its MIG
// devices.

func (n *Node) GPUByID(id string) (FakeGPU, bool) {
	id, _, _ = strings.Cut(id, "::")
	for _, g := range n.GPUs {
		if g.UUID == id || fmt.Sprint(g.Index) == id {
			return g, true
		}
	}
	for _, m := range n.MIGs {
		if m.UUID == id || m.ID == id {
			return m.Parent, true
		}
	}
	return FakeGPU{}, false
}

// StartHeldProbe creates the pod with its probe told to keep running
// (PROBE_HOLD) and waits until its container runs; the caller deletes it.
func (n *Node) StartHeldProbe(ctx context.Context, ns string, pod *corev1.Pod) (*corev1.Pod, error) {
	c := &pod.Spec.Containers[0]
	c.Env = append(c.Env, corev1.EnvVar{Name: "PROBE_HOLD", Value: "1"})
	pods := n.cp.Client.CoreV1().Pods(ns)
	created, err := pods.Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	var running *corev1.Pod
	err = framework.Poll(ctx, 2*time.Minute, func() (bool, error) {
		p, err := pods.Get(ctx, created.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		running = p
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			return false, fmt.Errorf("the held probe ended (phase %s)", p.Status.Phase)
		}
		return len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].State.Running != nil, nil
	})
	if err != nil {
		return running, fmt.Errorf("pod %s/%s did not start: %w\nstatus: %s\n%s", ns, pod.Name, err, statusJSON(running), n.LogTails())
	}
	return running, nil
}
