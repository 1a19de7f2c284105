package policy

import (
	"fmt"
)

// effect is what a finding does before the mode is applied.
type effect int

const (
	effectDeny effect = iota
	effectWarn
	// effectNone: the finding only requests an edit, and says nothing.
	effectNone
)

// Finding is one thing a rule found, as the rule returns it: the engine
// alone keeps, counts, orders and words findings, and turns the edits they
// request into the patch.
type Finding struct {
	rule   RuleID
	effect effect
	// container is what the finding is about; nil for the pod.
	container *containerRef
	// path is the offending field; for an env entry (onEnv), "" until the
	// engine keeps the finding, since most of a flood of them are only counted.
	path string
	// onEnv: the finding is about env entry envIndex of container, which
	// strip mode removes instead of denying.
	onEnv    bool
	envIndex int
	// folded are more env entries of the same rule and container, past the
	// first MaxFindings (envFolder): the engine judges each as it would a
	// finding of its own, and words none of them, since MaxFindings env
	// findings of the same effect come before.
	folded []int32
	// format and args are the message ("what; fix"), formatted only for a
	// finding the engine keeps.
	format string
	args   []any
	edit   edit
}

// editKind is a change to the object, or to what the engine reports of it,
// that a finding asks for.
type editKind int

const (
	editNone editKind = iota
	// editVoidValue replaces the value of env entry index with void.
	editVoidValue
	// editAppendVoid appends name=void to the container's env.
	editAppendVoid
	// editTemplateVoid names the container among those of a template's
	// pods that will get void (Result.TemplateVoid).
	editTemplateVoid
	// editNoGPU judges the container, for the rules after, as one without
	// GPU resources.
	editNoGPU
	// editPinGroups plans the group settings in pins.
	editPinGroups
)

// edit is a change a finding asks the engine for.
type edit struct {
	kind  editKind
	index int
	name  string
	pins  groupPins
}

// podFinding is a finding about the pod at path.
func podFinding(rule RuleID, eff effect, path, format string, args ...any) Finding {
	return Finding{rule: rule, effect: eff, path: path, format: format, args: args}
}

// containerFinding is a finding about container c at path.
func containerFinding(rule RuleID, eff effect, c *containerRef, path, format string, args ...any) Finding {
	return Finding{rule: rule, effect: eff, container: c, path: path, format: format, args: args}
}

// envFinding is a violation by env entry i of container c. In strip mode the
// engine removes the entry instead of denying.
func envFinding(rule RuleID, c *containerRef, i int, format string, args ...any) Finding {
	return Finding{rule: rule, effect: effectDeny, container: c, onEnv: true, envIndex: i, format: format, args: args}
}

// envFolder keeps a rule's env findings on one container bounded: the
// first MaxFindings are findings of their own, the rest are folded into
// the one after them as entry indexes. The engine words at most
// MaxFindings findings of an effect, and a rule's env findings share one,
// so the folded ones would only be counted: a container with tens of
// thousands of offending entries costs the rule an index each, not a
// Finding each.
type envFolder struct{ n, carrier int }

// add appends env finding f to out, or folds it.
func (e *envFolder) add(out []Finding, f Finding) []Finding {
	e.n++
	if e.n <= MaxFindings+1 {
		e.carrier = len(out)
		return append(out, f)
	}
	out[e.carrier].folded = append(out[e.carrier].folded, int32(f.envIndex))
	return out
}

// editOf is a finding that only asks for an edit of container c (nil for
// the pod).
func editOf(rule RuleID, c *containerRef, ed edit) Finding {
	return Finding{rule: rule, effect: effectNone, container: c, edit: ed}
}

// Message is the finding's message as the rule words it, before the engine
// applies the mode ("removed …" in strip mode, say).
func (f *Finding) Message() string {
	if f.format == "" {
		return ""
	}
	return fmt.Sprintf(f.format, f.args...)
}

// Path is the offending field's path.
func (f *Finding) Path() string {
	if f.onEnv {
		return f.container.path().Child("env").Index(f.envIndex).String()
	}
	return f.path
}
