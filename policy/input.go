package policy

import "context"

// Input is what a rule judges: one request, as the engine has put it up for
// judgement, and what the engine has made of the findings of the rules run
// before it. Rules read it and return their findings; only the engine
// writes it, so that a rule is a function of its input and can be tested
// alone.
type Input struct {
	ctx context.Context
	// e is the compiled policy.
	e         *Engine
	req       *Request
	t         target
	namespace string
	phase     Phase
	scope     scope
	// containers are those the request puts up for judgement, in order.
	containers []containerRef
	// oldAnnotations are the pod's annotations before an UPDATE (nil on CREATE).
	oldAnnotations map[string]string
	// mutable: this evaluation may patch the object (the mutating phase of a pod
	// that is not a mirror pod).
	mutable bool
	// sofar is what the engine has made of earlier findings; rules read it
	// through the methods below, since a later rule judges the object as the
	// earlier ones' edits leave it.
	sofar *outcome
}

// newInput is the input for request req about target t, before plan
// decides what of it is judged.
func (e *Engine) newInput(ctx context.Context, req *Request, t target, sofar *outcome) Input {
	return Input{ctx: ctx, e: e, req: req, t: t, phase: req.Phase, namespace: namespaceOf(req, t), sofar: sofar}
}

// removed reports whether entry i of container c is planned for removal.
func (in *Input) removed(c *containerRef, i int) bool {
	ed := in.sofar.edits[c.pos]
	return ed != nil && ed.remove[i]
}

// replacement is the value planned for entry i of container c, if any.
func (in *Input) replacement(c *containerRef, i int) (string, bool) {
	ed := in.sofar.edits[c.pos]
	if ed == nil {
		return "", false
	}
	v, ok := ed.replace[i]
	return v, ok
}

// pinned are the group settings pin-parent-groups planned.
func (in *Input) pinned() groupPins { return in.sofar.pins }

// denied reports whether an earlier finding denies (before the mode is
// applied).
func (in *Input) denied() bool { return in.sofar.kept[effectDeny] > 0 }
