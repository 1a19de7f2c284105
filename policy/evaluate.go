package policy

import (
	"context"
	"reflect"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/internal/wellknown"
)

// SubresourceEphemeralContainers is the subresource through which ephemeral
// containers (kubectl debug) are added to a running pod.
const SubresourceEphemeralContainers = "ephemeralcontainers"

// SubresourceStatus is the subresource through which the kubelet reports a
// pod's status. Its strategy resets the spec but keeps metadata, so an
// UPDATE of it can change the pod's annotations.
const SubresourceStatus = "status"

// Evaluate decides one admission request. It never panics on a malformed object: a
// kind it does not know, or a request it has nothing to say about, is allowed
// untouched.
func (e *Engine) Evaluate(ctx context.Context, req *Request) Result {
	mode, modeNote := e.modeFor(req.NamespaceLabels)
	untouched := Result{Allowed: true, Mode: mode, Violations: []Violation{}, Warnings: []Warning{}, Patch: nilPatch()}
	if req.Object == nil || reflect.ValueOf(req.Object).IsNil() {
		return untouched
	}
	t, ok := targetOf(req.Object)
	// A controller being deleted is left alone, so that garbage collection and
	// finalizers go on; a pod is judged whatever its state.
	if !ok || (t.object.DeletionTimestamp != nil && !t.isPod) {
		return untouched
	}
	ev := &evaluation{}
	ev.Input = e.newInput(ctx, req, t, &ev.outcome)
	exempt, waived := e.exemption(ev.namespace, req.UserInfo.Username, writtenByRequester(req, t), t.spec)
	if exempt != "" && waived == nil {
		untouched.Exempt = exempt
		untouched.AuditAnnotations = map[string]string{"exempt": exempt}
		return untouched
	}
	ev.waived = waived
	if !ev.plan() {
		return untouched
	}
	ev.stripping = ev.mutable && mode == config.ModeEnforce && e.policy.Spec.Action == config.ActionStrip
	if modeNote != "" {
		ev.record([]Finding{podFinding(RuleNamespaceMode, effectWarn, "metadata.labels["+wellknown.ModeLabel+"]", "%s", modeNote)})
	}
	ev.run()
	r := ev.result(mode)
	if waived != nil {
		if r.AuditAnnotations == nil {
			r.AuditAnnotations = map[string]string{}
		}
		r.AuditAnnotations["waived"] = describeWaiver(exempt, waived)
	}
	return r
}

// plan decides what of the object this request puts up for judgement; false means
// nothing.
func (in *Input) plan() bool {
	req, t := in.req, in.t
	if t.isBinding {
		// The API server copies a binding's annotations onto the pod before
		// its sandbox exists: each is judged as if added to the pod.
		if in.phase != Validating || req.Operation != admissionv1.Create {
			return false
		}
		in.scope = scopeAddedAnnotations
		return true
	}
	if !t.isPod {
		// Controllers are judged through their templates, and only in the validating
		// phase: templates are not patched. On UPDATE only a changed template counts,
		// so that scaling, finalizers and garbage collection of old objects go on.
		if in.phase != Validating {
			return false
		}
		switch req.Operation {
		case admissionv1.Create:
		case admissionv1.Update:
			old, ok := targetOf(req.OldObject)
			if ok && equality.Semantic.DeepEqual(old.meta, t.meta) && equality.Semantic.DeepEqual(old.spec, t.spec) {
				return false
			}
		default:
			return false
		}
		in.scope = scopeTemplate
		in.containers = in.e.containersOf(t.spec, t.specPath)
		return true
	}
	// Mirror pods reflect static manifests on a node: judged, but never mutated.
	in.mutable = in.phase == Mutating && !isMirrorPod(t.meta)
	switch {
	case req.Operation == admissionv1.Create && req.SubResource == "":
		in.scope = scopePod
		in.containers = in.e.containersOf(t.spec, t.specPath)
	case req.Operation == admissionv1.Update && req.SubResource == SubresourceEphemeralContainers:
		in.scope = scopeNewEphemeral
		in.containers = in.e.newEphemeralContainers(t.spec, t.specPath, oldEphemeralNames(req))
	case req.Operation == admissionv1.Update && (req.SubResource == "" || req.SubResource == SubresourceStatus):
		// Pod env is immutable; what an update can add is annotations, which the NRI
		// plugin and the kubelet read again when a sandbox is recreated. The status
		// subresource can change them too.
		in.scope = scopeAddedAnnotations
		if old, ok := targetOf(req.OldObject); ok {
			in.oldAnnotations = old.meta.Annotations
		}
	default:
		return false
	}
	return true
}

// scope is what part of an object a request puts up for judgement.
type scope int

const (
	scopePod              scope = iota // a new pod: everything
	scopeTemplate                      // a controller's pod template: everything but the patch
	scopeNewEphemeral                  // ephemeral containers added to a running pod
	scopeAddedAnnotations              // annotations added to a running pod
)

// run applies the registered rules that the request's scope calls for, in
// their order: pod-level rules, then each container's rules.
func (ev *evaluation) run() {
	for _, r := range registry {
		if r.PodCheck != nil && r.runs(ev.scope) && !ev.waived[r.ID] {
			ev.record(r.PodCheck(&ev.Input))
		}
	}
	for i := range ev.containers {
		c := &ev.containers[i]
		for _, r := range registry {
			if r.ContainerCheck != nil && !ev.waived[r.ID] {
				ev.record(r.ContainerCheck(&ev.Input, c))
			}
		}
	}
}

// writtenByRequester: the part of the pod this request judges is written by
// whoever sends it, not by the pod's service account: anything an UPDATE adds
// to a running pod (ephemeral containers, annotations through the pod or its
// status), and a binding's annotations.
func writtenByRequester(req *Request, t target) bool {
	return t.isBinding || (t.isPod && req.Operation == admissionv1.Update)
}

func oldEphemeralNames(req *Request) map[string]bool {
	names := map[string]bool{}
	if old, ok := targetOf(req.OldObject); ok {
		for _, ec := range old.spec.EphemeralContainers {
			names[ec.Name] = true
		}
	}
	return names
}

func namespaceOf(req *Request, t target) string {
	switch {
	case req.Namespace != "":
		return req.Namespace
	case t.object.Namespace != "":
		return t.object.Namespace
	}
	return "default"
}

// nilPatch is the empty patch: [] in JSON, never null.
func nilPatch() []jsonpatch.Operation { return []jsonpatch.Operation{} }

// isMirrorPod reports whether a pod is the kubelet's mirror of a static pod: the
// annotation's presence counts, as for the kubelet.
func isMirrorPod(meta *metav1.ObjectMeta) bool {
	_, ok := meta.Annotations[MirrorPodAnnotation]
	return ok
}
