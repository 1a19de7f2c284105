package policy

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/internal/wellknown"
)

// reported is one finding as the engine keeps it: worded, with its path.
type reported struct {
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
	remove  map[int]bool
	add     []corev1.EnvVar
}

// MaxFindings is how many findings of each effect (deny, warn) an evaluation
// lists in full; the rest are counted (Result.OmittedViolations and a closing
// warning).
const MaxFindings = 20

// maxPatchRemovals is how many entries of one env list are removed one
// operation each; beyond it the patch replaces the list with what is kept,
// so that the patch never outgrows the object.
const maxPatchRemovals = 16

// omittedKey is what an omitted finding would have become.
type omittedKey struct {
	rule     RuleID
	effect   effect
	stripped bool
}

// evaluation is the state of one Evaluate call: the input the rules judge,
// and what the engine makes of their findings.
type evaluation struct {
	Input
	outcome
	// stripping: strip mode removes offending env entries in this evaluation.
	stripping bool
	// waived are the rules a service account exemption waives for this
	// request: they do not run.
	waived RuleSet
}

// outcome is what the engine has made of the findings so far. Rules read
// it through Input; only the engine writes it.
type outcome struct {
	findings []reported
	// kept counts the findings kept by effect, omitted those beyond.
	kept    [2]int
	omitted map[omittedKey]int
	edits   map[int]*envEdits // by containerRef.pos
	// templateVoid names the containers of a template whose pods will get void.
	templateVoid []string
	// pins are the group settings planned by pin-parent-groups.
	pins groupPins
}

// record takes the findings of one rule call, in order: it makes the edits
// they ask for, and keeps or counts what they report.
func (ev *evaluation) record(fs []Finding) {
	for i := range fs {
		f := &fs[i]
		ev.apply(f)
		switch {
		case f.effect == effectNone:
		case f.onEnv:
			ev.keepEnv(f)
			for _, i := range f.folded {
				g := *f
				g.envIndex, g.folded = int(i), nil
				ev.keepEnv(&g)
			}
		default:
			r := reported{rule: f.rule, effect: f.effect, path: f.path}
			if f.container != nil {
				r.container = f.container.c.Name
			}
			ev.keep(r, func(r *reported) { r.message = f.Message() })
		}
	}
}

// apply makes the edit a finding asks for.
func (ev *evaluation) apply(f *Finding) {
	c := f.container
	switch f.edit.kind {
	case editVoidValue:
		ed := ev.editsFor(c)
		if ed.replace == nil {
			ed.replace = map[int]string{}
		}
		ed.replace[f.edit.index] = voidValue
	case editAppendVoid:
		ed := ev.editsFor(c)
		ed.add = append(ed.add, corev1.EnvVar{Name: f.edit.name, Value: voidValue})
	case editTemplateVoid:
		ev.templateVoid = append(ev.templateVoid, c.c.Name)
	case editNoGPU:
		// The engine's own list of containers: rules after this one judge
		// the container as one without GPU resources.
		ev.containers[c.pos].gpu = false
	case editPinGroups:
		ev.pins = f.edit.pins
	}
}

// keep records a finding in full while fewer than MaxFindings of its effect
// are kept, and otherwise only counts it: an object with tens of thousands of
// offending entries costs a count each, not a formatted message each, and its
// denial, warnings and log lines stay bounded. The decision still counts
// every one, and a denied object always lists a reason.
func (ev *evaluation) keep(f reported, describe func(*reported)) {
	if ev.kept[f.effect] >= MaxFindings {
		if ev.omitted == nil {
			ev.omitted = map[omittedKey]int{}
		}
		ev.omitted[omittedKey{rule: f.rule, effect: f.effect, stripped: f.stripped}]++
		return
	}
	ev.kept[f.effect]++
	describe(&f)
	ev.findings = append(ev.findings, f)
}

// keepEnv records a violation by an env entry. In strip mode the mutating
// phase removes the entry instead of denying.
func (ev *evaluation) keepEnv(fd *Finding) {
	c, i := fd.container, fd.envIndex
	f := reported{rule: fd.rule, effect: effectDeny, container: c.c.Name}
	templateStrip := false
	if !ev.t.isPod && ev.e.policy.Spec.Action == config.ActionStrip {
		// Strip mode removes the entry from each pod the template makes: the
		// controller itself is admitted, with a warning.
		f.effect = effectWarn
		templateStrip = true
	}
	f.stripped = f.effect == effectDeny && ev.stripping
	if f.stripped {
		ev.editsFor(c).remove[i] = true
	}
	ev.keep(f, func(f *reported) {
		f.path = fd.Path()
		f.message = fd.Message()
		switch {
		case templateStrip:
			f.message = whatClause(f.message) + "; strip mode removes it from each pod"
		case f.stripped:
			v := &c.c.Env[i]
			shown := v.Name + "=" + quote(v.Value)
			if v.ValueFrom != nil {
				shown = v.Name + " (valueFrom)"
			}
			f.message = "removed " + shown
		}
	})
}

func (ev *evaluation) editsFor(c *containerRef) *envEdits {
	if ev.edits == nil {
		ev.edits = map[int]*envEdits{}
	}
	ed := ev.edits[c.pos]
	if ed == nil {
		ed = &envEdits{remove: map[int]bool{}}
		ev.edits[c.pos] = ed
	}
	return ed
}

// patch renders the planned edits as JSON Patch operations against the object as
// given: value replacements, then removals from the highest index down, then appends.
// A list losing more than maxPatchRemovals entries is replaced whole instead.
func (ev *evaluation) patch() []jsonpatch.Operation {
	ops := []jsonpatch.Operation{}
	for k, c := range ev.containers {
		ed := ev.edits[k]
		if ed == nil {
			continue
		}
		env := c.pointer() + "/env"
		if len(ed.remove) > maxPatchRemovals {
			ops = append(ops, jsonpatch.NewOperation("replace", env, ed.keptEnv(c.c.Env)))
			continue
		}
		for _, i := range sortedKeys(ed.replace) {
			ops = append(ops, jsonpatch.NewOperation("replace", env+"/"+strconv.Itoa(i)+"/value", ed.replace[i]))
		}
		remove := slices.Sorted(maps.Keys(ed.remove))
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

// voidAnnotation is the patch that names, in wellknown.VoidAnnotation, the
// containers of a new pod that gpuguard gave void; nothing when none got
// it. An ephemeral container's update gets none: that subresource takes
// only the ephemeral containers from a request.
func (ev *evaluation) voidAnnotation() []jsonpatch.Operation {
	if ev.req.Operation != admissionv1.Create {
		return nil
	}
	var names []string
	for k, c := range ev.containers {
		// Appended by inject-void, or "none" rewritten by device-env.
		if ed := ev.edits[k]; ed != nil && (len(ed.add) > 0 || len(ed.replace) > 0) {
			names = append(names, c.c.Name)
		}
	}
	value := strings.Join(names, ",")
	if value == "" {
		// None, or only a nameless container, which the API server refuses
		// anyway: the backstop writes nothing for it either.
		return nil
	}
	if len(ev.t.meta.Annotations) == 0 {
		return []jsonpatch.Operation{jsonpatch.NewOperation("add", "/metadata/annotations", map[string]string{wellknown.VoidAnnotation: value})}
	}
	return []jsonpatch.Operation{jsonpatch.NewOperation("add", AnnotationPointer(wellknown.VoidAnnotation), value)}
}

// AnnotationPointer is the JSON Pointer of annotation key in an object
// (RFC 6901: "~" and "/" escaped), for patches; the backstop's too.
func AnnotationPointer(key string) string {
	return "/metadata/annotations/" + strings.ReplaceAll(strings.ReplaceAll(key, "~", "~0"), "/", "~1")
}

// keptEnv is env with the edits applied: values replaced, entries removed,
// entries added.
func (ed *envEdits) keptEnv(env []corev1.EnvVar) []corev1.EnvVar {
	kept := make([]corev1.EnvVar, 0, len(env)-len(ed.remove)+len(ed.add))
	for i, v := range env {
		if ed.remove[i] {
			continue
		}
		if value, ok := ed.replace[i]; ok {
			v.Value = value
		}
		kept = append(kept, v)
	}
	return append(kept, ed.add...)
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
	r := Result{Allowed: true, Mode: mode, Violations: []Violation{}, Warnings: []Warning{}, Patch: []jsonpatch.Operation{},
		TemplateVoid: ev.templateVoid}
	audit := map[string][]string{}
	var advice []Warning
	for _, f := range ev.findings {
		v := Violation{Path: f.path, Rule: f.rule, Container: f.container, Message: f.message}
		switch {
		case mode == config.ModeAudit:
			audit[string(f.rule)] = append(audit[string(f.rule)], f.path+": "+f.message)
		case f.stripped:
			r.Warnings = append(r.Warnings, Warning{Rule: f.rule, Path: f.path, Message: f.message})
			audit["stripped"] = append(audit["stripped"], f.path+": "+f.message)
		case f.effect == effectDeny && mode == config.ModeEnforce:
			r.Violations = append(r.Violations, v)
		default:
			advice = append(advice, Warning{Rule: f.rule, Path: f.path, Message: f.message})
		}
	}
	advice = append(advice, ev.addOmitted(&r, mode, audit)...)
	// Advice is given by the validating phase, so that a client does not see it
	// twice; a request the mutating phase denies never reaches validation, so
	// there it comes with the denial.
	if ev.phase == Validating || r.denied() {
		r.Warnings = append(r.Warnings, advice...)
	}
	if len(audit) > 0 {
		r.AuditAnnotations = make(map[string]string, len(audit))
		for k, v := range audit {
			r.AuditAnnotations[k] = strings.Join(v, "; ")
		}
	}
	r.Allowed = !r.denied()
	if r.Allowed && ev.mutable {
		r.Patch = append(ev.patch(), ev.voidAnnotation()...)
		if !ev.pins.empty() {
			r.Patch = append(ev.pins.patch(ev.t.spec, ev.containers), r.Patch...)
			// The validating phase sees the pod pinned and says nothing of it.
			r.Warnings = append(r.Warnings, ev.pins.notes(ev.t.specPath, ev.containers, "set to")...)
		}
	}
	return r
}

// addOmitted accounts for the findings beyond MaxFindings, as result does for
// the others: omitted violations are counted in the result, the rest are
// summed up in one line each for the audit annotations, the warnings and the
// advice it returns.
func (ev *evaluation) addOmitted(r *Result, mode config.Mode, audit map[string][]string) (advice []Warning) {
	if len(ev.omitted) == 0 {
		return nil
	}
	var stripped, advised int
	var strippedRules, advisedRules []string
	for k, n := range ev.omitted {
		switch {
		case mode == config.ModeAudit:
			audit[string(k.rule)] = append(audit[string(k.rule)], fmt.Sprintf("and %d more", n))
		case k.stripped:
			stripped += n
			strippedRules = append(strippedRules, string(k.rule))
		case k.effect == effectDeny && mode == config.ModeEnforce:
			r.OmittedViolations += n
			if !slices.Contains(r.OmittedRules, k.rule) {
				r.OmittedRules = append(r.OmittedRules, k.rule)
			}
		default:
			advised += n
			advisedRules = append(advisedRules, string(k.rule))
		}
	}
	slices.Sort(r.OmittedRules)
	if stripped > 0 {
		msg := fmt.Sprintf("removed %d more entries like those above", stripped)
		r.Warnings = append(r.Warnings, Warning{Rule: RuleID(firstSorted(strippedRules)), Message: msg})
		audit["stripped"] = append(audit["stripped"], msg)
	}
	if advised > 0 {
		advice = append(advice, Warning{Rule: RuleID(firstSorted(advisedRules)), Message: fmt.Sprintf("%d more findings like those above", advised)})
	}
	return advice
}

func firstSorted(rules []string) string {
	slices.Sort(rules)
	return rules[0]
}

// denied: some violation, listed or omitted, applies.
func (r *Result) denied() bool { return len(r.Violations) > 0 || r.OmittedViolations > 0 }
