package policy

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuguard/gpuguard/config"
)

// effect is what a finding does before the mode is applied.
type effect int

const (
	effectDeny effect = iota
	effectWarn
)

// finding is one thing a check found.
type finding struct {
	rule      RuleID
	path      string
	container string
	message   string
	effect    effect
	// stripped is set when strip mode removed the offending env entry.
	stripped bool
}

// envEdits are the patch operations planned for one container's env.
type envEdits struct {
	replace map[int]string
	remove  []int
	add     []corev1.EnvVar
}

// evaluation is the state of one Evaluate call.
type evaluation struct {
	ctx        context.Context
	e          *Engine
	req        *Request
	t          target
	namespace  string
	phase      Phase
	scope      scope
	containers []containerRef
	// oldAnnotations are the pod's annotations before an UPDATE (nil on CREATE).
	oldAnnotations map[string]string
	// mutable: this evaluation may patch the object (the mutating phase of a pod
	// that is not a mirror pod).
	mutable bool
	// stripping: strip mode removes offending env entries in this evaluation.
	stripping bool
	findings  []finding
	edits     map[int]*envEdits // by containerRef.pos
}

// report records a finding about a container, or about the pod when c is nil.
func (ev *evaluation) report(rule RuleID, eff effect, c *containerRef, path, format string, args ...any) {
	f := finding{rule: rule, effect: eff, path: path, message: fmt.Sprintf(format, args...)}
	if c != nil {
		f.container = c.c.Name
	}
	ev.findings = append(ev.findings, f)
}

// reportEnv records a violation by env entry i of container c. In strip mode the
// mutating phase removes the entry instead of denying.
func (ev *evaluation) reportEnv(rule RuleID, c *containerRef, i int, format string, args ...any) {
	path := c.path().Child("env").Index(i).String()
	if !ev.t.isPod && ev.e.policy.Spec.Action == config.ActionStrip {
		// Strip mode removes the entry from each pod the template makes: the
		// controller itself is admitted, with a warning.
		ev.report(rule, effectWarn, c, path, format+" (strip mode removes it from the pods)", args...)
		return
	}
	ev.report(rule, effectDeny, c, path, format, args...)
	if ev.stripping {
		v := &c.c.Env[i]
		shown := v.Name + "=" + quote(v.Value)
		if v.ValueFrom != nil {
			shown = v.Name + " (valueFrom)"
		}
		f := &ev.findings[len(ev.findings)-1]
		f.stripped = true
		f.message = fmt.Sprintf("removed %s from container %q", shown, c.c.Name)
		ev.editsFor(c).remove = appendUnique(ev.editsFor(c).remove, i)
	}
}

func (ev *evaluation) editsFor(c *containerRef) *envEdits {
	if ev.edits == nil {
		ev.edits = map[int]*envEdits{}
	}
	ed := ev.edits[c.pos]
	if ed == nil {
		ed = &envEdits{}
		ev.edits[c.pos] = ed
	}
	return ed
}

// removed reports whether entry i of container c is planned for removal.
func (ev *evaluation) removed(c *containerRef, i int) bool {
	ed := ev.edits[c.pos]
	return ed != nil && slices.Contains(ed.remove, i)
}

func appendUnique(s []int, i int) []int {
	if slices.Contains(s, i) {
		return s
	}
	return append(s, i)
}

// patch renders the planned edits as JSON Patch operations against the object as
// given: value replacements, then removals from the highest index down, then appends.
func (ev *evaluation) patch() []jsonpatch.Operation {
	ops := []jsonpatch.Operation{}
	for k, c := range ev.containers {
		ed := ev.edits[k]
		if ed == nil {
			continue
		}
		env := c.pointer() + "/env"
		for _, i := range sortedKeys(ed.replace) {
			ops = append(ops, jsonpatch.NewOperation("replace", env+"/"+strconv.Itoa(i)+"/value", ed.replace[i]))
		}
		remove := slices.Clone(ed.remove)
		slices.Sort(remove)
		for _, i := range slices.Backward(remove) {
			ops = append(ops, jsonpatch.NewOperation("remove", env+"/"+strconv.Itoa(i), nil))
		}
		if len(ed.add) == 0 {
			continue
		}
		if len(c.c.Env) == 0 {
			ops = append(ops, jsonpatch.NewOperation("add", env, ed.add))
			continue
		}
		for _, v := range ed.add {
			ops = append(ops, jsonpatch.NewOperation("add", env+"/-", v))
		}
	}
	return ops
}

func sortedKeys(m map[int]string) []int {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// result applies the mode to the findings.
func (ev *evaluation) result(mode config.Mode) Result {
	r := Result{Allowed: true, Mode: mode, Violations: []Violation{}, Warnings: []string{}, Patch: []jsonpatch.Operation{}}
	audit := map[string][]string{}
	var advice []string
	for _, f := range ev.findings {
		v := Violation{Path: f.path, Rule: f.rule, Container: f.container, Message: f.message}
		switch {
		case mode == config.ModeAudit:
			audit[string(f.rule)] = append(audit[string(f.rule)], f.path+": "+f.message)
		case f.stripped:
			r.Warnings = append(r.Warnings, warning(f.rule, f.message))
			audit["stripped"] = append(audit["stripped"], f.path+": "+f.message)
		case f.effect == effectDeny && mode == config.ModeEnforce:
			r.Violations = append(r.Violations, v)
		default:
			advice = append(advice, warning(f.rule, f.message))
		}
	}
	// Advice is given by the validating phase, so that a client does not see it
	// twice; a request the mutating phase denies never reaches validation, so
	// there it comes with the denial.
	if ev.phase == Validating || len(r.Violations) > 0 {
		r.Warnings = append(r.Warnings, advice...)
	}
	if len(audit) > 0 {
		r.AuditAnnotations = make(map[string]string, len(audit))
		for k, v := range audit {
			r.AuditAnnotations[k] = strings.Join(v, "; ")
		}
	}
	r.Allowed = len(r.Violations) == 0
	if r.Allowed && ev.mutable {
		r.Patch = ev.patch()
	}
	return r
}

// maxWarning is the longest admission warning gpuguard returns: kubectl prints them
// one per line.
const maxWarning = 120

func warning(rule RuleID, msg string) string {
	w := "gpuguard " + string(rule) + ": " + msg
	if len(w) <= maxWarning {
		return w
	}
	cut := maxWarning - len("…")
	for cut > 0 && !utf8.RuneStart(w[cut]) {
		cut--
	}
	return w[:cut] + "…"
}

// quote shows a user-supplied value in a message, shortened so that messages stay
// on one readable line.
func quote(s string) string {
	const max = 24
	if len(s) > max {
		cut := max
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return strconv.Quote(s)
}
