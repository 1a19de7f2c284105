// Package celexpr builds the text of CEL expressions: literals, paths and
// the few idioms gpuguard's rules share. It evaluates nothing; the rules in
// policy/ carry their CEL form as text built here, and cel/ assembles it
// into admission policies.
package celexpr

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Str is a CEL string literal.
func Str(s string) string { return strconv.Quote(s) }

// List is a CEL list of string literals.
func List(items []string) string {
	quoted := make([]string, len(items))
	for i, s := range items {
		quoted[i] = Str(s)
	}
	return "[" + strings.Join(quoted, ", ") + "]"
}

// Or joins alternatives; an empty set is false.
func Or(alts ...string) string {
	var kept []string
	for _, a := range alts {
		if a != "" && a != "false" {
			kept = append(kept, "("+a+")")
		}
	}
	if len(kept) == 0 {
		return "false"
	}
	return strings.Join(kept, " || ")
}

// GlobToRegexp turns a gpuResources pattern into an anchored regular
// expression with path.Match's meaning of * and ?, which never match a slash.
// Character classes are refused: CEL's RE2 and path.Match differ in their
// details.
func GlobToRegexp(glob string) (string, error) {
	if strings.ContainsAny(glob, "[\\") {
		return "", fmt.Errorf("pattern %q: character classes and escapes cannot be rendered for CEL exactly", glob)
	}
	var b strings.Builder
	b.WriteString("^")
	for _, r := range glob {
		switch r {
		case '*':
			b.WriteString("[^/]*")
		case '?':
			b.WriteString("[^/]")
		default:
			b.WriteString(regexp.QuoteMeta(string(r)))
		}
	}
	b.WriteString("$")
	return b.String(), nil
}

// CleanPath is a path as the webhook compares it, for paths that need no
// cleaning: rooted, without one trailing slash.
func CleanPath(p string) string {
	rooted := fmt.Sprintf(`(%[1]s.startsWith("/") ? %[1]s : "/" + %[1]s)`, p)
	return fmt.Sprintf(`(%[1]s.size() > 1 && %[1]s.endsWith("/") ? %[1]s.substring(0, %[1]s.size() - 1) : %[1]s)`, rooted)
}

// Judgeable says whether CEL can compare a path exactly: one with "//" or a
// "." segment needs path.Clean, which CEL lacks, and is left to the webhook
// rather than judged wrongly.
func Judgeable(p string) string {
	return fmt.Sprintf(`!%[1]s.contains("//") && !%[1]s.contains("/.") && !%[1]s.startsWith(".")`, p)
}

// LastEntry is, in container c, the list of the variable's env entries and
// its last one (valid where the list is not empty).
func LastEntry(name string) (entries, last string) {
	entries = fmt.Sprintf(`c.env.filter(e, e.name == %s)`, Str(name))
	return entries, fmt.Sprintf(`%[1]s[size(%[1]s) - 1]`, entries)
}

// EffectivelyVoid: in container c, the last entry of the variable is a
// literal void or "".
func EffectivelyVoid(name string) string {
	entries, last := LastEntry(name)
	return fmt.Sprintf(`has(c.env) && size(%s) > 0 && !has(%[2]s.valueFrom) && (!has(%[2]s.value) || %[2]s.value in ["void", ""])`, entries, last)
}

// SubResource is the request's subresource, "" for the object itself (the
// field is absent then).
const SubResource = `(has(request.subResource) ? request.subResource : "")`

// MirrorPod: the object is the kubelet's mirror of a static pod.
const MirrorPod = `(has(object.metadata.annotations) && "kubernetes.io/config.mirror" in object.metadata.annotations)`
