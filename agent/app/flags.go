package app

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gpuguard/gpuguard/agent/health"
)

// enumValue is a string flag that takes only the listed values: a bad one
// fails when the flags are parsed, and pflag's message names the flag.
type enumValue struct {
	value   *string
	allowed []string
}

func newEnumValue(p *string, allowed ...string) *enumValue {
	return &enumValue{value: p, allowed: allowed}
}

func (e *enumValue) String() string { return *e.value }
func (e *enumValue) Type() string   { return "string" }

func (e *enumValue) Set(s string) error {
	if err := oneOf(s, e.allowed...); err != nil {
		return err
	}
	*e.value = s
	return nil
}

// oneOf says what is wrong with s when it is none of allowed.
func oneOf(s string, allowed ...string) error {
	if slices.Contains(allowed, s) {
		return nil
	}
	return fmt.Errorf("%q: want %s", s, orList(allowed))
}

func orList(s []string) string {
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}

// xidsValue is a list of XIDs, "none" for an empty one.
type xidsValue struct{ value *[]uint64 }

func (x xidsValue) Type() string { return "xids" }

func (x xidsValue) String() string {
	if len(*x.value) == 0 {
		return "none"
	}
	return health.FormatXIDs(*x.value)
}

func (x xidsValue) Set(s string) error {
	set, err := health.ParseXIDs(s)
	if err != nil {
		return err
	}
	xids := make([]uint64, 0, len(set))
	for id := range set {
		xids = append(xids, id)
	}
	slices.Sort(xids)
	*x.value = xids
	return nil
}
