package cel

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/policy"
)

// containerList is one kind of container list in a pod spec.
type containerList struct {
	field string // in the pod spec
	kind  string // in messages
}

var containerLists = []containerList{
	{"initContainers", "init container"},
	{"containers", "container"},
	{"ephemeralContainers", "ephemeral container"},
}

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

// subResource is the request's subresource, "" for the object itself (the field is
// absent then).
const subResource = `(has(request.subResource) ? request.subResource : "")`

// rules builds the predicates of the policy for a container bound to c.
type rules struct {
	p          *config.Policy
	gpu        string   // c is a GPU container
	deviceVars []string // NVIDIA_VISIBLE_DEVICES and the extra device variables
	protected  []string // every protected name, device variables included
}

func newRules(p *config.Policy) (*rules, error) {
	r := &rules{p: p, deviceVars: p.Spec.DeviceVariables(), protected: p.Spec.ProtectedNames()}
	exact, globs := p.Spec.GPUResourcePatterns()
	var patterns []string
	for _, g := range globs {
		re, err := globToRegexp(g)
		if err != nil {
			return nil, err
		}
		patterns = append(patterns, fmt.Sprintf("k.matches(%s)", str(re)))
	}
	isGPUName := or(append([]string{fmt.Sprintf("k in %s", list(exact))}, patterns...)...)
	r.gpu = fmt.Sprintf(`has(c.resources) && has(c.resources.limits) && c.resources.limits.exists(k, (%s) && quantity(string(c.resources.limits[k])).isGreaterThan(quantity("0")))`, isGPUName)
	return r, nil
}

// deviceEnv: an entry of a device variable with a granting literal value; on a
// container without GPUs "none" is not granting (the webhook rewrites it).
func (r *rules) deviceEnv(gpu bool) string {
	allowed := `["void", "", "none"]`
	if gpu {
		allowed = `["void", ""]`
	}
	return fmt.Sprintf(`has(c.env) && c.env.exists(e, e.name in %s && !has(e.valueFrom) && has(e.value) && !(e.value in %s))`,
		list(r.deviceVars), allowed)
}

// protectedEnv: a protected variable where the policy does not allow it: on a
// container without GPUs, any; on a GPU container, one not allowed there or with a
// value outside its allowedValues.
func (r *rules) protectedEnv(gpu bool) string {
	var all, nowhere, badValue []string
	for _, v := range r.p.Spec.Env.ProtectedVariables {
		all = append(all, v.Name)
		switch {
		case !v.AllowOnGPUContainers:
			nowhere = append(nowhere, v.Name)
		case len(v.AllowedValues) > 0:
			badValue = append(badValue, fmt.Sprintf(`e.name == %s && has(e.value) && e.value.split(",").exists(x, x.trim() != "" && !(x.trim() in %s))`,
				str(v.Name), list(v.AllowedValues)))
		}
	}
	violation := fmt.Sprintf("e.name in %s", list(all))
	if gpu {
		violation = or(append([]string{fmt.Sprintf("e.name in %s", list(nowhere))}, badValue...)...)
	}
	return fmt.Sprintf(`has(c.env) && c.env.exists(e, !has(e.valueFrom) && (%s))`, violation)
}

// envValueFrom: a protected name whose value comes from elsewhere.
func (r *rules) envValueFrom() string {
	return fmt.Sprintf(`has(c.env) && c.env.exists(e, e.name in %s && has(e.valueFrom))`, list(r.protected))
}

// envFromPrefix: an envFrom prefix that can spell a protected name.
func (r *rules) envFromPrefix() string {
	return fmt.Sprintf(`has(c.envFrom) && c.envFrom.exists(f, has(f.prefix) && f.prefix != "" && %s.exists(n, n.startsWith(f.prefix)))`, list(r.protected))
}

// envFromUnprefixed: any envFrom without a prefix (judged on GPU containers only);
// rendered only when the policy denies those outright (inspecting ConfigMaps is
// webhook-only).
func (r *rules) envFromUnprefixed() string {
	return `has(c.envFrom) && c.envFrom.exists(f, !has(f.prefix) || f.prefix == "")`
}

// deviceListMount: a mount under a device-list root, for paths CEL can judge.
func (r *rules) deviceListMount() string {
	return fmt.Sprintf(`has(c.volumeMounts) && c.volumeMounts.exists(m, %s && %s.exists(root, %s.startsWith(root)))`,
		judgeable("m.mountPath"), list(r.p.Spec.DeviceListMountRoots), cleanPath("m.mountPath"))
}

// effectivelyVoid: the last entry of a device variable is a literal void or "".
func effectivelyVoid(name string) string {
	entries := fmt.Sprintf(`c.env.filter(e, e.name == %s)`, str(name))
	last := fmt.Sprintf(`%[1]s[size(%[1]s) - 1]`, entries)
	return fmt.Sprintf(`has(c.env) && size(%s) > 0 && !has(%[2]s.valueFrom) && (!has(%[2]s.value) || %[2]s.value in ["void", ""])`, entries, last)
}

// finalState: a container (judged on those without GPUs) left without void in some
// device variable.
func (r *rules) finalState() string {
	var missing []string
	for _, n := range r.deviceVars {
		missing = append(missing, "!("+effectivelyVoid(n)+")")
	}
	return or(missing...)
}

// privileged: a privileged container.
func (r *rules) privileged() string {
	return `has(c.securityContext) && has(c.securityContext.privileged) && c.securityContext.privileged`
}

// capabilities: a container that adds SYS_ADMIN or ALL. A privileged one is
// judged by privileged alone, as in the engine, unless privileged only warns.
func (r *rules) capabilities() string {
	notPrivileged := `!(has(c.securityContext.privileged) && c.securityContext.privileged) && `
	a := r.p.Spec.Advisories
	if policy.CapabilitiesJudgePrivileged(a.Privileged, a.Capabilities) {
		notPrivileged = ""
	}
	return `has(c.securityContext) && ` + notPrivileged +
		`has(c.securityContext.capabilities) && has(c.securityContext.capabilities.add) && ` +
		`c.securityContext.capabilities.add.exists(a, a.upperAscii() in ["SYS_ADMIN", "CAP_SYS_ADMIN", "ALL", "CAP_ALL"])`
}

// deviceAnnotation: a denied annotation key, on UPDATE (of the pod or of its
// status, which keeps metadata) only when added or changed.
func (r *rules) deviceAnnotation() string {
	a := r.p.Spec.Annotations
	denied := or(fmt.Sprintf("k in %s", list(a.DeniedKeys)), fmt.Sprintf("%s.exists(p, k.startsWith(p))", list(a.DeniedPrefixes)))
	return fmt.Sprintf(subResource+` in ["", "status"] && has(object.metadata.annotations) && object.metadata.annotations.exists(k, (%s) && `+
		`(request.operation == "CREATE" || !has(oldObject.metadata.annotations) || !(k in oldObject.metadata.annotations) || `+
		`oldObject.metadata.annotations[k] != object.metadata.annotations[k]))`, denied)
}

// AnnotationsChanged is true unless the request is an UPDATE of pods/status
// that leaves the pod's annotations as they were: the kubelet's status
// reports, which nothing of gpuguard's judges. The chart's webhook and the
// backstop use it so that those never reach them.
const AnnotationsChanged = subResource + ` != "status" || ` +
	`has(object.metadata.annotations) != has(oldObject.metadata.annotations) || ` +
	`(has(object.metadata.annotations) && object.metadata.annotations != oldObject.metadata.annotations)`

// sensitiveHostPath: a hostPath equal to, below or above a sensitive path, with /run
// and /var/run alike, for paths CEL can judge.
func (r *rules) sensitiveHostPath() string {
	var paths []string
	for _, s := range r.p.Spec.SensitiveHostPaths {
		paths = append(paths, policy.RunAliases(s)...)
	}
	slices.Sort(paths)
	p := cleanPath("v.hostPath.path")
	return fmt.Sprintf(`request.operation == "CREATE" && has(object.spec.volumes) && object.spec.volumes.exists(v, has(v.hostPath) && %s && `+
		`%s.exists(s, %[3]s == s || %[3]s == "/" || %[3]s.startsWith(s + "/") || s.startsWith(%[3]s + "/")))`,
		judgeable("v.hostPath.path"), list(slices.Compact(paths)), p)
}
