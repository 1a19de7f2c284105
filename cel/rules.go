package cel

import (
	"fmt"
	"strings"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/policy"
	"github.com/gpuguard/gpuguard/policy/celexpr"
)

// containerList is one kind of container list in a pod spec.
type containerList struct {
	field string // in the pod spec
}

var containerLists = []containerList{{"initContainers"}, {"containers"}, {"ephemeralContainers"}}

// variable names the CEL variable of this list's containers of a class ("gpu" or
// "plain").
func (l containerList) variable(class string) string {
	return class + strings.ToUpper(l.field[:1]) + l.field[1:]
}

// judged is the CEL list of the containers a request puts up for judgement: all
// of them on CREATE; on an UPDATE of pods/ephemeralcontainers, only the ephemeral
// containers it adds.
func (l containerList) judged() string {
	all := fmt.Sprintf("(has(object.spec.%[1]s) ? object.spec.%[1]s : [])", l.field)
	if l.field != "ephemeralContainers" {
		return fmt.Sprintf(`(request.operation == "CREATE" ? %s : [])`, all)
	}
	return fmt.Sprintf(`%s.filter(c, request.operation == "CREATE" || (`+subResource+` == "ephemeralcontainers" && `+
		`!(has(oldObject.spec.ephemeralContainers) && oldObject.spec.ephemeralContainers.exists(o, o.name == c.name))))`, all)
}

// subResource is the request's subresource, "" for the object itself.
const subResource = celexpr.SubResource

// rules builds the predicates of the policy for a container bound to c.
type rules struct {
	p          *config.Policy
	gpu        string   // c is a GPU container
	deviceVars []string // NVIDIA_VISIBLE_DEVICES and the extra device variables
	protected  []string // every protected name, device variables included
	// hasWork is the pre-filter, rendered once for every policy and webhook
	// that carries it.
	hasWork string
	// hasInjectionWork is the MutatingAdmissionPolicy's narrower one.
	hasInjectionWork string
	// waivers are the policy's service account exemptions by pair.
	waivers policy.Waivers
}

func newRules(p *config.Policy) (*rules, error) {
	waivers, err := policy.NewWaivers(&p.Spec)
	if err != nil {
		return nil, err
	}
	r := &rules{p: p, deviceVars: p.Spec.DeviceVariables(), protected: p.Spec.ProtectedNames(), waivers: waivers}
	exact, globs := p.Spec.GPUResourcePatterns()
	var patterns []string
	for _, g := range globs {
		re, err := celexpr.GlobToRegexp(g)
		if err != nil {
			return nil, err
		}
		// The literal head of the pattern first: most keys (cpu, memory) fail
		// it without running the regular expression.
		head := g[:strings.IndexAny(g, "*?")]
		patterns = append(patterns, fmt.Sprintf("k.startsWith(%s) && k.matches(%s)", celexpr.Str(head), celexpr.Str(re)))
	}
	isGPUName := celexpr.Or(append([]string{fmt.Sprintf("k in %s", celexpr.List(exact))}, patterns...)...)
	r.gpu = fmt.Sprintf(`has(c.resources) && has(c.resources.limits) && c.resources.limits.exists(k, (%s) && quantity(string(c.resources.limits[k])).isGreaterThan(quantity("0")))`, isGPUName)
	r.hasWork = r.prefilter()
	r.hasInjectionWork = r.injectionPrefilter()
	return r, nil
}

// AnnotationsChanged is true unless the request is an UPDATE of pods/status
// that leaves the pod's annotations as they were: the kubelet's status
// reports, which nothing of gpuguard's judges. The chart's webhook and the
// backstop use it so that those never reach them.
const AnnotationsChanged = subResource + ` != "status" || ` +
	`has(object.metadata.annotations) != has(oldObject.metadata.annotations) || ` +
	`(has(object.metadata.annotations) && object.metadata.annotations != oldObject.metadata.annotations)`

// input is what the rules' CEL forms are rendered from.
func (r *rules) input() *policy.CELInput {
	var noGPU []string
	for _, l := range containerLists {
		noGPU = append(noGPU, fmt.Sprintf("size(variables.%s) == 0", l.variable("gpu")))
	}
	var judged []string
	for _, l := range containerLists {
		judged = append(judged, l.judged())
	}
	return &policy.CELInput{Policy: r.p, DeviceVars: r.deviceVars, Protected: r.protected, NoGPUContainer: strings.Join(noGPU, " && "), IsGPU: r.gpu,
		JudgedLists: judged}
}
