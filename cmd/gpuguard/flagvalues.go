package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gpuguard/gpuguard/webhook/hardening"
)

// Flag values with a type check their value when it is set, so that a bad
// one fails as the flags are parsed, naming the flag: pflag wraps each
// error as `invalid argument "maybe" for "--inject-void" flag: ...`.

// enumValue is one of a fixed set of strings.
type enumValue[T ~string] struct {
	p       *T
	allowed []T
}

func newEnumValue[T ~string](p *T, allowed []T) *enumValue[T] {
	return &enumValue[T]{p: p, allowed: allowed}
}

func (v *enumValue[T]) String() string { return string(*v.p) }
func (v *enumValue[T]) Type() string   { return "string" }
func (v *enumValue[T]) Set(s string) error {
	for _, a := range v.allowed {
		if T(s) == a {
			*v.p = a
			return nil
		}
	}
	names := make([]string, len(v.allowed))
	for i, a := range v.allowed {
		names[i] = string(a)
	}
	return fmt.Errorf("want one of %s", strings.Join(names, ", "))
}

// portValue is a TCP port, 1-65535.
type portValue struct{ p *int }

func (v portValue) String() string { return strconv.Itoa(*v.p) }
func (v portValue) Type() string   { return "port" }
func (v portValue) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("want a port, 1-65535")
	}
	*v.p = n
	return nil
}

// durationValue is a duration of at least min.
type durationValue struct {
	p   *time.Duration
	min time.Duration
}

func (v durationValue) String() string { return v.p.String() }
func (v durationValue) Type() string   { return "duration" }
func (v durationValue) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("want a duration such as 2s or 1m30s")
	}
	if d < v.min {
		if v.min == 0 {
			return fmt.Errorf("must not be negative")
		}
		return fmt.Errorf("want at least %s", v.min)
	}
	*v.p = d
	return nil
}

// positiveIntValue is an integer of at least min.
type positiveIntValue[T int | int64] struct {
	p   *T
	min T
}

func (v positiveIntValue[T]) String() string { return strconv.FormatInt(int64(*v.p), 10) }
func (v positiveIntValue[T]) Type() string   { return "int" }
func (v positiveIntValue[T]) Set(s string) error {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || T(n) < v.min {
		return fmt.Errorf("want an integer of at least %d", v.min)
	}
	*v.p = T(n)
	return nil
}

// namespacedNameValue is NAMESPACE/NAME; optional ones may be set empty.
type namespacedNameValue struct {
	p        *types.NamespacedName
	optional bool
}

func (v namespacedNameValue) String() string {
	if v.p.Name == "" {
		return ""
	}
	return v.p.String()
}
func (v namespacedNameValue) Type() string { return "namespace/name" }
func (v namespacedNameValue) Set(s string) error {
	if s == "" && v.optional {
		*v.p = types.NamespacedName{}
		return nil
	}
	ns, name, ok := strings.Cut(s, "/")
	if !ok || strings.Contains(name, "/") {
		return fmt.Errorf("want NAMESPACE/NAME")
	}
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return fmt.Errorf("namespace %q: %s", ns, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return fmt.Errorf("name %q: %s", name, strings.Join(errs, "; "))
	}
	*v.p = types.NamespacedName{Namespace: ns, Name: name}
	return nil
}

// labelsValue is a repeatable KEY=VALUE node label; the first use replaces
// the default.
type labelsValue struct {
	p       *[]hardening.Label
	changed bool
}

func (v *labelsValue) String() string {
	s := make([]string, len(*v.p))
	for i, l := range *v.p {
		s[i] = l.Key + "=" + l.Value
	}
	return "[" + strings.Join(s, ",") + "]"
}
func (v *labelsValue) Type() string { return "stringArray" }
func (v *labelsValue) Set(s string) error {
	l, err := hardening.ParseLabel(s)
	if err != nil {
		return err
	}
	if errs := validation.IsQualifiedName(l.Key); len(errs) > 0 {
		return fmt.Errorf("label key %q: %s", l.Key, strings.Join(errs, "; "))
	}
	if errs := validation.IsValidLabelValue(l.Value); len(errs) > 0 {
		return fmt.Errorf("label value %q: %s", l.Value, strings.Join(errs, "; "))
	}
	if !v.changed {
		*v.p = nil
		v.changed = true
	}
	*v.p = append(*v.p, l)
	return nil
}

var (
	_ pflag.Value = (*enumValue[string])(nil)
	_ pflag.Value = portValue{}
	_ pflag.Value = durationValue{}
	_ pflag.Value = positiveIntValue[int]{}
	_ pflag.Value = namespacedNameValue{}
	_ pflag.Value = (*labelsValue)(nil)
)
