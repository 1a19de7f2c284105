package policy

import (
	"errors"
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// checkUnhonouredGPURequest is the rule unhonoured-gpu-request: GPU
// requests that the node a pod is created bound to cannot allocate.
//
// Fields read: spec.nodeName; resources.limits of every container; the
// allocatable resources of that node (Request.Nodes).
//
// A pod created with spec.nodeName skips the scheduler. Where the node does
// not advertise a resource the pod asks for, the kubelet admits the pod and
// drops the request (removeMissingExtendedResources in
// pkg/kubelet/lifecycle/predicate.go), and the device manager allocates
// nothing for it. A container none of whose GPU resources the node
// advertises is then judged as a container without GPUs: it gets void, and
// the rules for such containers apply, so that an image's
// NVIDIA_VISIBLE_DEVICES=all does not give it every GPU. Each such
// container gets a warning that says why. A node that does not exist yet
// advertises nothing; a node that cannot be read denies the pod (retried by
// its controller), since judging it either way could be wrong. Without a
// NodeSource (offline checks) the requests are taken as they are written.
//
// The CEL backstop cannot read Nodes: it judges such containers as GPU
// containers (the declared gap), and the node agent's verifier reports what
// they reach.
func checkUnhonouredGPURequest(in *Input) []Finding {
	node := in.t.spec.NodeName
	if node == "" || in.req.Nodes == nil || !slices.ContainsFunc(in.containers, func(c containerRef) bool { return c.gpu }) {
		return nil
	}
	at := in.t.specPath.Child("nodeName").String()
	allocatable, err := in.req.Nodes.NodeAllocatable(in.ctx, node)
	if err != nil && !errors.Is(err, ErrNodeNotFound) {
		return []Finding{podFinding(RuleUnhonouredGPURequest, effectDeny, at,
			"cannot tell whether node %s advertises the GPU resources the pod asks for: %v; retry", quote(node), err)}
	}
	var out []Finding
	for k := range in.containers {
		c := &in.containers[k]
		if !c.gpu || in.e.advertisesAGPUOf(c.c, allocatable) {
			continue
		}
		// The engine judges the container as one without GPUs from here on.
		f := containerFinding(RuleUnhonouredGPURequest, effectWarn, c, at,
			"asks for GPU resources that node %s does not advertise: the kubelet drops such a request and allocates nothing, "+
				"so it is judged as a container without GPUs (and gets NVIDIA_VISIBLE_DEVICES=void); let the scheduler place the pod", quote(node))
		f.edit = edit{kind: editNoGPU}
		out = append(out, f)
	}
	return out
}

// advertisesAGPUOf reports whether allocatable holds, above zero, one of
// the GPU resources container c asks for above zero: the kubelet keeps
// those, and the device plugin's allocation then sets the container's
// devices.
func (e *Engine) advertisesAGPUOf(c *corev1.Container, allocatable corev1.ResourceList) bool {
	for name, q := range c.Resources.Limits {
		if q.Sign() > 0 && e.isGPUResource(string(name)) {
			if a, ok := allocatable[name]; ok && a.Sign() > 0 {
				return true
			}
		}
	}
	return false
}

// RuleUnhonouredGPURequest is the rule of checkUnhonouredGPURequest.
const RuleUnhonouredGPURequest RuleID = "unhonoured-gpu-request"

func init() {
	register(&Rule{
		ID: RuleUnhonouredGPURequest,
		Summary: "a GPU container of a pod created bound to a node (`spec.nodeName`) that advertises none of its GPU resources " +
			"is judged as a container without GPUs, with a warning; deny where the node cannot be read",
		Order: 5, PodCheck: checkUnhonouredGPURequest, PodScopes: []scope{scopePod, scopeTemplate},
		Trigger: func(in *CELInput) *CELTrigger {
			return &CELTrigger{Pod: `has(object.spec.nodeName) && object.spec.nodeName != ""`}
		},
		Gap: "the backstop cannot read Nodes: it judges the GPU containers of a pod created bound to a node as GPU containers, " +
			"whatever the node advertises; the webhook and the node agent's verifier catch the rest",
	})
}
