package config

import (
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Validate checks a decoded policy and returns every problem it finds.
func Validate(p *Policy) field.ErrorList {
	var errs field.ErrorList
	if p.APIVersion != APIVersion {
		errs = append(errs, field.NotSupported(field.NewPath("apiVersion"), p.APIVersion, []string{APIVersion}))
	}
	if p.Kind != Kind {
		errs = append(errs, field.NotSupported(field.NewPath("kind"), p.Kind, []string{Kind}))
	}
	spec := field.NewPath("spec")
	s := &p.Spec
	errs = append(errs, enum(spec.Child("mode"), string(s.Mode), Modes)...)
	errs = append(errs, enum(spec.Child("namespaceModeOverride"), string(s.NamespaceModeOverride),
		[]string{string(OverrideTightenOnly), string(OverrideAny)})...)
	errs = append(errs, enum(spec.Child("action"), string(s.Action), []string{string(ActionDeny), string(ActionStrip)})...)
	errs = append(errs, validateGPUResources(spec.Child("gpuResources"), s.GPUResources)...)
	errs = append(errs, validateEnv(spec.Child("env"), &s.Env)...)
	errs = append(errs, validateAnnotations(spec.Child("annotations"), &s.Annotations)...)
	errs = append(errs, absolutePaths(spec.Child("deviceListMountRoots"), s.DeviceListMountRoots)...)
	errs = append(errs, absolutePaths(spec.Child("sensitiveHostPaths"), s.SensitiveHostPaths)...)
	errs = append(errs, absolutePaths(spec.Child("writeProtectedHostPaths"), s.WriteProtectedHostPaths)...)
	errs = append(errs, absolutePaths(spec.Child("runtimeStateHostPaths"), s.RuntimeStateHostPaths)...)
	errs = append(errs, validateWritableHostPaths(spec.Child("writableHostPaths"), s)...)
	errs = append(errs, enum(spec.Child("sensitiveHostPathParents"), string(s.SensitiveHostPathParents),
		[]string{string(ParentsReadOnlyUnprivileged), string(ParentsDeny)})...)
	for i, name := range s.NVIDIARuntimeClasses {
		errs = append(errs, dnsSubdomain(spec.Child("nvidiaRuntimeClasses").Index(i), name)...)
	}
	errs = append(errs, validateCapabilities(spec.Child("allowedCapabilities"), s.AllowedCapabilities)...)
	severities := []string{string(SeverityWarn), string(SeverityDeny)}
	errs = append(errs, enum(spec.Child("advisories", "nvidiaRuntimeClass"), string(s.Advisories.NVIDIARuntimeClass), severities)...)
	errs = append(errs, enum(spec.Child("advisories", "privileged"), string(s.Advisories.Privileged), severities)...)
	errs = append(errs, enum(spec.Child("advisories", "capabilities"), string(s.Advisories.Capabilities), severities)...)
	errs = append(errs, validateExemptions(spec.Child("exemptions"), &s.Exemptions)...)
	errs = append(errs, validateKAIScheduler(spec.Child("integrations", "kaiScheduler"), &s.Integrations.KAIScheduler)...)
	return errs
}

// validateKAIScheduler: with fractions on, KAI's scheduler names are needed,
// or no pod would match; the binder's accounts name service accounts, the
// only kind of user KAI's binder runs as.
func validateKAIScheduler(fld *field.Path, k *KAIScheduler) field.ErrorList {
	var errs field.ErrorList
	if k.Fractions && len(k.SchedulerNames) == 0 {
		errs = append(errs, field.Required(fld.Child("schedulerNames"), "fractions is on: name KAI's scheduler, e.g. kai-scheduler"))
	}
	for i, name := range k.SchedulerNames {
		errs = append(errs, dnsSubdomain(fld.Child("schedulerNames").Index(i), name)...)
	}
	if k.ReservationNamespace != "" {
		if msgs := validation.IsDNS1123Label(k.ReservationNamespace); len(msgs) > 0 {
			errs = append(errs, field.Invalid(fld.Child("reservationNamespace"), k.ReservationNamespace, strings.Join(msgs, "; ")))
		}
	}
	for i, user := range k.BinderServiceAccounts {
		parts := strings.Split(user, ":")
		if len(parts) != 4 || parts[0] != "system" || parts[1] != "serviceaccount" || parts[2] == "" || parts[3] == "" {
			errs = append(errs, field.Invalid(fld.Child("binderServiceAccounts").Index(i), user,
				"want system:serviceaccount:NAMESPACE:NAME"))
		}
	}
	return errs
}

func enum(fld *field.Path, value string, allowed []string) field.ErrorList {
	if slices.Contains(allowed, value) {
		return nil
	}
	return field.ErrorList{field.NotSupported(fld, value, allowed)}
}

func validateGPUResources(fld *field.Path, patterns []string) field.ErrorList {
	var errs field.ErrorList
	if len(patterns) == 0 {
		return append(errs, field.Required(fld, "at least one GPU resource name is needed, e.g. nvidia.com/gpu"))
	}
	seen := map[string]bool{}
	for i, p := range patterns {
		f := fld.Index(i)
		if seen[p] {
			errs = append(errs, field.Duplicate(f, p))
		}
		seen[p] = true
		if _, err := path.Match(p, ""); err != nil {
			errs = append(errs, field.Invalid(f, p, "bad pattern: "+err.Error()))
			continue
		}
		// A pattern is a resource name in which '*' stands for any characters.
		if msgs := validation.IsQualifiedName(strings.ReplaceAll(p, "*", "x")); len(msgs) > 0 {
			errs = append(errs, field.Invalid(f, p, "not a resource name pattern: "+strings.Join(msgs, "; ")))
		}
	}
	return errs
}

func validateEnv(fld *field.Path, env *EnvPolicy) field.ErrorList {
	var errs field.ErrorList
	seen := map[string]bool{VisibleDevicesEnv: true}
	for i, name := range env.ExtraDeviceVariables {
		f := fld.Child("extraDeviceVariables").Index(i)
		errs = append(errs, envName(f, name, seen)...)
	}
	for i, v := range env.ProtectedVariables {
		f := fld.Child("protectedVariables").Index(i)
		errs = append(errs, envName(f.Child("name"), v.Name, seen)...)
		if len(v.AllowedValues) > 0 && !v.AllowOnGPUContainers {
			errs = append(errs, field.Invalid(f.Child("allowedValues"), v.AllowedValues,
				"only takes effect with allowOnGPUContainers: true"))
		}
		for j, value := range v.AllowedValues {
			if value == "" || strings.Contains(value, ",") {
				errs = append(errs, field.Invalid(f.Child("allowedValues").Index(j), value,
					"must be one non-empty item; a comma-separated value is checked item by item"))
			}
		}
	}
	errs = append(errs, enum(fld.Child("unprefixedEnvFromOnGPU"), string(env.UnprefixedEnvFromOnGPU),
		[]string{string(EnvFromInspect), string(EnvFromWarn), string(EnvFromDeny)})...)
	return errs
}

// envName checks a variable name and that no list names it twice; NVIDIA_VISIBLE_DEVICES
// is always protected and so may not be listed at all.
func envName(fld *field.Path, name string, seen map[string]bool) field.ErrorList {
	if name == VisibleDevicesEnv {
		return field.ErrorList{field.Invalid(fld, name, "is always a device variable; remove it from this list")}
	}
	if seen[name] {
		return field.ErrorList{field.Duplicate(fld, name)}
	}
	seen[name] = true
	if msgs := validation.IsEnvVarName(name); len(msgs) > 0 {
		return field.ErrorList{field.Invalid(fld, name, strings.Join(msgs, "; "))}
	}
	return nil
}

func validateAnnotations(fld *field.Path, a *AnnotationPolicy) field.ErrorList {
	var errs field.ErrorList
	for i, p := range a.DeniedPrefixes {
		if p == "" {
			errs = append(errs, field.Invalid(fld.Child("deniedPrefixes").Index(i), p, "an empty prefix would deny every annotation"))
		}
	}
	for i, p := range a.IgnoredPrefixes {
		if p == "" {
			errs = append(errs, field.Invalid(fld.Child("ignoredPrefixes").Index(i), p, "an empty prefix would silence every warning"))
		}
	}
	for i, l := range a.SuspectDomainLabels {
		if msgs := validation.IsDNS1123Label(l); len(msgs) > 0 || strings.Contains(l, "-") {
			errs = append(errs, field.Invalid(fld.Child("suspectDomainLabels").Index(i), l,
				"must be one lower-case word (letters and digits); keys are split at \".\" and \"-\""))
		}
	}
	for i, k := range a.DeniedKeys {
		if msgs := validation.IsQualifiedName(k); len(msgs) > 0 {
			errs = append(errs, field.Invalid(fld.Child("deniedKeys").Index(i), k, strings.Join(msgs, "; ")))
		}
	}
	return errs
}

// validateWritableHostPaths: a writable path is absolute, and is neither
// the host's root nor at or above a sensitive path, where it would name
// what stays denied anyway (or, for /, lift the whole class).
func validateWritableHostPaths(fld *field.Path, s *PolicySpec) field.ErrorList {
	errs := absolutePaths(fld, s.WritablePaths())
	for i, e := range s.WritableHostPaths {
		for j, sa := range e.ServiceAccounts {
			if sa.Namespace == "" || sa.Name == "" {
				errs = append(errs, field.Invalid(fld.Index(i).Child("serviceAccounts").Index(j), sa, "a service account needs its namespace and name"))
			}
		}
		for j, ns := range e.Namespaces {
			if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
				errs = append(errs, field.Invalid(fld.Index(i).Child("namespaces").Index(j), ns, strings.Join(msgs, "; ")))
			}
		}
		w := e.Path
		c := path.Clean(w)
		if !strings.HasPrefix(w, "/") {
			continue
		}
		if c == "/" {
			errs = append(errs, field.Invalid(fld.Index(i), w, "the host's root cannot be writable: name data directories"))
			continue
		}
		for _, sp := range s.SensitiveHostPaths {
			if sp = path.Clean(sp); sp == c || strings.HasPrefix(sp, c+"/") {
				errs = append(errs, field.Invalid(fld.Index(i), w, "holds the sensitive path "+sp+": name a data directory beside it"))
				break
			}
		}
	}
	return errs
}

// capabilityNamePattern is a capability as the policy writes it: upper-case
// ASCII, without CAP_, so that the engine's and CEL's comparisons agree.
var capabilityNamePattern = regexp.MustCompile(`^[A-Z][A-Z0-9_]*$`)

// validateCapabilities: each allowed capability is a plain name without
// CAP_, listed once.
func validateCapabilities(fld *field.Path, names []string) field.ErrorList {
	var errs field.ErrorList
	seen := map[string]bool{}
	for i, n := range names {
		switch {
		case !capabilityNamePattern.MatchString(n) || strings.HasPrefix(n, "CAP_"):
			errs = append(errs, field.Invalid(fld.Index(i), n, "must be a capability name in upper case without CAP_, such as IPC_LOCK"))
		case seen[n]:
			errs = append(errs, field.Duplicate(fld.Index(i), n))
		}
		seen[n] = true
	}
	return errs
}

func absolutePaths(fld *field.Path, paths []string) field.ErrorList {
	var errs field.ErrorList
	for i, p := range paths {
		if !strings.HasPrefix(p, "/") {
			errs = append(errs, field.Invalid(fld.Index(i), p, "must be an absolute path"))
		}
	}
	return errs
}

func dnsSubdomain(fld *field.Path, name string) field.ErrorList {
	if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
		return field.ErrorList{field.Invalid(fld, name, strings.Join(msgs, "; "))}
	}
	return nil
}

func validateExemptions(fld *field.Path, e *Exemptions) field.ErrorList {
	var errs field.ErrorList
	for i, sa := range e.ServiceAccounts {
		f := fld.Child("serviceAccounts").Index(i)
		if msgs := validation.IsDNS1123Label(sa.Namespace); len(msgs) > 0 {
			errs = append(errs, field.Invalid(f.Child("namespace"), sa.Namespace, strings.Join(msgs, "; ")))
		}
		errs = append(errs, dnsSubdomain(f.Child("name"), sa.Name)...)
		for j, rule := range sa.Rules {
			if rule == "" {
				errs = append(errs, field.Required(f.Child("rules").Index(j), "a rule ID"))
			}
		}
	}
	for i, ns := range e.Namespaces {
		if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
			errs = append(errs, field.Invalid(fld.Child("namespaces").Index(i), ns, strings.Join(msgs, "; ")))
		}
	}
	for i, u := range e.Usernames {
		if u == "" {
			errs = append(errs, field.Required(fld.Child("usernames").Index(i), "a user name"))
		}
	}
	return errs
}

// Advice returns what is allowed in a policy but worth a second look, one line per
// finding, for logs and for `gpuguard check`.
func Advice(p *Policy) []string {
	var out []string
	for i, ns := range p.Spec.Exemptions.Namespaces {
		out = append(out, fmt.Sprintf("spec.exemptions.namespaces[%d]: every pod in namespace %q is exempt; "+
			"prefer serviceAccounts pairs, and make sure tenants cannot create a namespace of that name", i, ns))
	}
	for i, sa := range p.Spec.Exemptions.ServiceAccounts {
		if len(sa.Rules) == 0 {
			out = append(out, fmt.Sprintf("spec.exemptions.serviceAccounts[%d]: %s/%s is exempt from every rule; "+
				"name the rules its workload needs in rules", i, sa.Namespace, sa.Name))
		}
	}
	if !p.Spec.InjectVoid {
		out = append(out, "spec.injectVoid: false: containers without GPU resources keep the image's NVIDIA_VISIBLE_DEVICES (CUDA images say all)")
	}
	if p.Spec.Mode != ModeEnforce {
		out = append(out, fmt.Sprintf("spec.mode: %s: violations are reported, not denied", p.Spec.Mode))
	}
	return out
}
