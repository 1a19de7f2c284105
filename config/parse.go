package config

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/util/validation/field"
	sigsyaml "sigs.k8s.io/yaml"
)

//go:embed default.yaml
var defaultYAML []byte

// DefaultYAML returns the embedded default policy document, as shipped.
func DefaultYAML() []byte { return bytes.Clone(defaultYAML) }

// Default returns the embedded default policy. It panics only if the embedded file is
// broken, which the package's tests rule out.
func Default() *Policy {
	p, err := parseOnto(nil, "default.yaml", defaultYAML)
	if err != nil {
		panic(fmt.Sprintf("embedded default policy is invalid: %v", err))
	}
	return p
}

// ConfigMapKey is the ConfigMap data key that holds the policy document.
const ConfigMapKey = "policy.yaml"

// Problem is one thing wrong with a policy document.
type Problem struct {
	// Line in the document, 1-based; 0 when unknown.
	Line int
	// Field is the path of the offending field, such as spec.mode.
	Field string
	// Message says what is wrong.
	Message string
}

// Error is returned for a policy document that does not parse or validate.
type Error struct {
	// Source names the document: a file name, or a ConfigMap key.
	Source   string
	Problems []Problem
}

func (e *Error) Error() string {
	lines := make([]string, 0, len(e.Problems))
	for _, p := range e.Problems {
		loc := e.Source
		if p.Line > 0 {
			loc = fmt.Sprintf("%s:%d", loc, p.Line)
		}
		if p.Field != "" {
			lines = append(lines, fmt.Sprintf("%s: %s: %s", loc, p.Field, p.Message))
		} else {
			lines = append(lines, fmt.Sprintf("%s: %s", loc, p.Message))
		}
	}
	return strings.Join(lines, "\n")
}

// Load parses a policy given either as the policy document itself or as a ConfigMap
// manifest that holds it under the key policy.yaml.
func Load(source string, data []byte) (*Policy, error) {
	var head struct {
		APIVersion string            `json:"apiVersion"`
		Kind       string            `json:"kind"`
		Data       map[string]string `json:"data"`
	}
	if err := sigsyaml.Unmarshal(data, &head); err == nil && head.Kind == "ConfigMap" {
		doc, ok := head.Data[ConfigMapKey]
		if !ok {
			return nil, &Error{Source: source, Problems: []Problem{{Field: "data", Message: fmt.Sprintf("ConfigMap has no key %q holding the policy", ConfigMapKey)}}}
		}
		return Parse(fmt.Sprintf("%s: data[%s]", source, ConfigMapKey), []byte(doc))
	}
	return Parse(source, data)
}

// ReadFile reads a policy document, or a ConfigMap manifest holding one,
// from a file; a read error is returned as it is (an *fs.PathError), a
// document that does not load as an *InvalidError.
func ReadFile(path string) (*Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	p, err := Load(path, data)
	if err != nil {
		return nil, &InvalidError{err}
	}
	return p, nil
}

// InvalidError is a policy document that does not load.
type InvalidError struct{ Err error }

func (e *InvalidError) Error() string { return e.Err.Error() }
func (e *InvalidError) Unwrap() error { return e.Err }

// Parse parses and validates one policy document. Fields it leaves out keep the
// default policy's values. Unknown fields, values of the wrong type, bad patterns and
// bad enum values are errors that name the field and its line.
func Parse(source string, data []byte) (*Policy, error) {
	return parseOnto(Default(), source, data)
}

// parseOnto decodes a document; fields it leaves out take base's values (none when
// base is nil).
func parseOnto(base *Policy, source string, data []byte) (*Policy, error) {
	root, err := singleDocument(data)
	if err != nil {
		return nil, &Error{Source: source, Problems: []Problem{{Message: err.Error()}}}
	}
	lines := map[string]int{}
	problems := checkShape(root.Content[0], reflect.TypeFor[Policy](), nil, lines)
	if len(problems) > 0 {
		return nil, &Error{Source: source, Problems: problems}
	}

	for _, name := range []string{"apiVersion", "kind"} {
		if _, ok := lines[name]; !ok {
			problems = append(problems, Problem{Line: root.Content[0].Line, Field: name, Message: "Required value: a policy starts with apiVersion: " + APIVersion + " and kind: " + Kind})
		}
	}
	if len(problems) > 0 {
		return nil, &Error{Source: source, Problems: problems}
	}
	p := &Policy{}
	if err := sigsyaml.Unmarshal(data, p); err != nil {
		return nil, &Error{Source: source, Problems: []Problem{{Message: err.Error()}}}
	}
	if base != nil {
		fillOmitted(reflect.ValueOf(p).Elem(), reflect.ValueOf(base).Elem(), nil, lines)
	}
	if errs := Validate(p); len(errs) > 0 {
		return nil, &Error{Source: source, Problems: problemsFrom(errs, lines)}
	}
	return p, nil
}

// singleDocument reads exactly one YAML document.
func singleDocument(data []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var root yaml.Node
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("empty policy document")
		}
		return nil, errors.New(strings.TrimPrefix(err.Error(), "yaml: "))
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("a policy is one YAML document; found more after line %d", root.Content[0].Line)
	}
	if len(root.Content) == 0 {
		return nil, errors.New("empty policy document")
	}
	return &root, nil
}

// fillOmitted copies from base every field the document did not mention. Lists are
// taken whole, from the document or from base, never merged item by item.
func fillOmitted(dst, base reflect.Value, path *field.Path, present map[string]int) {
	t := dst.Type()
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		child := field.NewPath(name)
		if path != nil {
			child = path.Child(name)
		}
		if _, ok := present[child.String()]; !ok {
			dst.Field(i).Set(base.Field(i))
		} else if t.Field(i).Type.Kind() == reflect.Struct {
			fillOmitted(dst.Field(i), base.Field(i), child, present)
		}
	}
}

func problemsFrom(errs field.ErrorList, lines map[string]int) []Problem {
	out := make([]Problem, 0, len(errs))
	for _, e := range errs {
		out = append(out, Problem{Line: lineOf(e.Field, lines), Field: e.Field, Message: e.ErrorBody()})
	}
	return out
}

// lineOf finds the line of a field path, or of its closest parent that has one.
func lineOf(path string, lines map[string]int) int {
	for path != "" {
		if l, ok := lines[path]; ok {
			return l
		}
		i := strings.LastIndexAny(path, ".[")
		if i < 0 {
			break
		}
		path = path[:i]
	}
	return 0
}

// checkShape walks the YAML tree against the Go type it will be decoded into and
// reports unknown fields and values of the wrong kind, with their lines. It records
// the line of every field path it visits for later validation errors.
func checkShape(n *yaml.Node, t reflect.Type, path *field.Path, lines map[string]int) []Problem {
	if n.Kind == yaml.AliasNode {
		return []Problem{{Line: n.Line, Field: path.String(), Message: "YAML aliases are not supported in a policy"}}
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		if t.Kind() == reflect.Struct {
			return nil // an empty section: its fields keep their defaults
		}
		// An empty list or switch would quietly turn a protection off.
		return []Problem{{Line: n.Line, Field: path.String(), Message: "empty value: give a value ([] for an empty list), or remove the field to keep the default"}}
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind == yaml.ScalarNode && stringForms[t] {
			return checkShape(n, reflect.TypeFor[string](), path, lines)
		}
		if n.Kind != yaml.MappingNode {
			return []Problem{{Line: n.Line, Field: path.String(), Message: "must be a mapping of fields"}}
		}
		return checkStruct(n, t, path, lines)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return []Problem{{Line: n.Line, Field: path.String(), Message: "must be a list"}}
		}
		var problems []Problem
		for i, item := range n.Content {
			p := path.Index(i)
			lines[p.String()] = item.Line
			problems = append(problems, checkShape(item, t.Elem(), p, lines)...)
		}
		return problems
	case reflect.Bool:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
			return []Problem{{Line: n.Line, Field: path.String(), Message: fmt.Sprintf("must be true or false, not %q", n.Value)}}
		}
	case reflect.String:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
			return []Problem{{Line: n.Line, Field: path.String(), Message: fmt.Sprintf("must be a string (quote %q if it is one)", n.Value)}}
		}
	}
	return nil
}

func checkStruct(n *yaml.Node, t reflect.Type, path *field.Path, lines map[string]int) []Problem {
	fields := jsonFields(t)
	var problems []Problem
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, value := n.Content[i], n.Content[i+1]
		child := field.NewPath(key.Value)
		if path != nil {
			child = path.Child(key.Value)
		}
		if first, dup := lines[child.String()]; dup {
			problems = append(problems, Problem{Line: key.Line, Field: child.String(),
				Message: fmt.Sprintf("field given twice (first on line %d)", first)})
			continue
		}
		lines[child.String()] = key.Line
		ft, ok := fields[key.Value]
		if !ok {
			problems = append(problems, Problem{Line: key.Line, Field: child.String(),
				Message: fmt.Sprintf("unknown field; %s has: %s", describe(path), strings.Join(slices.Sorted(maps.Keys(fields)), ", "))})
			continue
		}
		problems = append(problems, checkShape(value, ft, child, lines)...)
	}
	return problems
}

func describe(path *field.Path) string {
	if path == nil {
		return "the document"
	}
	return path.String()
}

// jsonFields maps the JSON names of a struct's fields to their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := make(map[string]reflect.Type, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name != "" && name != "-" {
			out[name] = f.Type
		}
	}
	return out
}

// AsError unwraps a policy Error.
func AsError(err error) (*Error, bool) {
	var e *Error
	ok := errors.As(err, &e)
	return e, ok
}
