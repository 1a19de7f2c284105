package config

import (
	"reflect"
	"strings"
)

// enumValues are the values of the policy's enumerated fields, by type.
var enumValues = map[reflect.Type][]string{
	reflect.TypeFor[Mode]():          Modes,
	reflect.TypeFor[ModeOverride]():  {string(OverrideTightenOnly), string(OverrideAny)},
	reflect.TypeFor[Action]():        {string(ActionDeny), string(ActionStrip)},
	reflect.TypeFor[EnvFromAction](): {string(EnvFromInspect), string(EnvFromWarn), string(EnvFromDeny)},
	reflect.TypeFor[ParentAction]():  {string(ParentsReadOnlyUnprivileged), string(ParentsDeny)},
	reflect.TypeFor[Severity]():      {string(SeverityWarn), string(SeverityDeny)},
}

// stringForms are the entry types also written as a plain string, their
// first field's value (a writable path without scope).
var stringForms = map[reflect.Type]bool{reflect.TypeFor[WritableHostPath](): true}

// SpecJSONSchema is the JSON Schema of a policy's spec, derived from the Go
// types: unknown fields are refused at every level, enumerated fields take
// only their values, and the entries of a list (a protected variable, a
// service account) need the fields they cannot do without. Every field of
// the spec itself is optional, as in the document. The chart's
// values.schema.json carries it for policy.spec, so that a typo fails helm
// install or upgrade before anything changes; Validate still checks what a
// schema cannot (patterns, paths, duplicates).
func SpecJSONSchema() map[string]any {
	return schemaOf(reflect.TypeFor[PolicySpec](), false)
}

// schemaOf is the schema of a type; inList marks the struct of a list entry,
// whose fields without omitempty are required.
func schemaOf(t reflect.Type, inList bool) map[string]any {
	if values, ok := enumValues[t]; ok {
		return map[string]any{"enum": values}
	}
	if stringForms[t] {
		return map[string]any{"anyOf": []any{map[string]any{"type": "string"}, structSchema(t, true)}}
	}
	switch t.Kind() {
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Int, reflect.Int32, reflect.Int64:
		return map[string]any{"type": "integer"}
	case reflect.Slice:
		return map[string]any{"type": "array", "items": schemaOf(t.Elem(), true)}
	case reflect.Struct:
		return structSchema(t, inList)
	}
	panic("config: no JSON Schema for " + t.String()) // a new field type: extend schemaOf
}

func structSchema(t reflect.Type, inList bool) map[string]any {
	props := map[string]any{}
	var required []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		props[name] = schemaOf(f.Type, false)
		if inList && !strings.Contains(opts, "omitempty") {
			required = append(required, name)
		}
	}
	s := map[string]any{"type": "object", "additionalProperties": false, "properties": props}
	if len(required) > 0 {
		s["required"] = required
	}
	return s
}
