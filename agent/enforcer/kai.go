package enforcer

import (
	"context"
	"fmt"
	"maps"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuguard/gpuguard/agent/verifier"
	"github.com/gpuguard/gpuguard/policy"
)

// KAI Scheduler binds a fraction pod to a GPU through a reservation pod:
// its binder labels the fraction pod with a GPU group (runai-gpu-group),
// runs one pod in its reservation namespace for each group on the node,
// labelled alike and asking the kubelet for one whole GPU, and writes the
// fraction's ConfigMap with what that pod reports of the GPU it got. The
// ConfigMap is the binder's word; the kubelet's allocation to the
// reservation pod is the node's. So the enforcer holds a fraction
// container's device list to the GPUs the kubelet allocated to the
// reservation pods of its pod's groups, and refuses the container where
// they cannot be found.

// kaiBound are the device IDs the kubelet allocated to the reservation
// pods of c's GPU groups on this node; unbound, when set, says why they
// cannot be told. The kubelet's PodResources lists the node's reservation
// pods with their allocations (which also keeps the search to this node);
// each is read from the API server for its group, as the agent reads pods
// for their service accounts.
func (p *Plugin) kaiBound(ctx context.Context, c verifier.Container) (bound []string, unbound string) {
	groups := p.Exemptions.KAIGroups(ctx, c)
	if len(groups) == 0 {
		return nil, fmt.Sprintf("its pod carries no %s label (KAI's binder has not bound it, or the pod cannot be read)", policy.KAIGPUGroupLabel)
	}
	rules := p.Rules.Load()
	ns := rules.policy.Integrations.KAIScheduler.Reservations()
	all, err := p.Allocations.Allocations(ctx)
	if err != nil {
		return nil, "the kubelet's allocations cannot be read: " + err.Error()
	}
	reserved := map[string][]string{} // reservation pods of this node by name: their GPU IDs
	for key, byResource := range all {
		if key.Namespace != ns {
			continue
		}
		if _, seen := reserved[key.Pod]; !seen {
			reserved[key.Pod] = nil // listed, with or without a GPU
		}
		for resource, ids := range byResource {
			if rules.policy.IsGPUResource(resource) {
				reserved[key.Pod] = append(reserved[key.Pod], ids...)
			}
		}
	}
	groupOf := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(reserved)) {
		pod, err := p.Exemptions.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			continue // gone since the kubelet listed it
		case err != nil:
			return nil, fmt.Sprintf("reservation pod %s/%s cannot be read: %s", ns, name, err.Error())
		}
		groupOf[name] = pod.Labels[policy.KAIGPUGroupLabel]
	}
	for _, group := range groups {
		found := false
		for _, name := range slices.Sorted(maps.Keys(groupOf)) {
			if groupOf[name] != group {
				continue
			}
			if len(reserved[name]) == 0 {
				return nil, fmt.Sprintf("the kubelet allocated no GPU to reservation pod %s/%s of its GPU group %s", ns, name, group)
			}
			bound, found = append(bound, reserved[name]...), true
		}
		if !found {
			return nil, fmt.Sprintf("no reservation pod of its GPU group %s runs on this node in namespace %s", group, ns)
		}
	}
	slices.Sort(bound)
	return slices.Compact(bound), ""
}
