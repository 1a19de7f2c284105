package manifest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	sigsyaml "sigs.k8s.io/yaml"
)

// Kind says where the pods of a custom resource kind are described, for
// the kinds whose operators create pods: paths to pod templates
// (metadata and spec), to pod specs, or to containers, each judged as the
// pod the operator will create. A path is a field path with * for every
// key of a map and [*] for every element of a list:
// spec.pytorchReplicaSpecs.*.template, spec.tasks[*].template.
type Kind struct {
	// Group is the API group (apiVersion without its version); Kind the kind.
	Group string `json:"group"`
	Kind  string `json:"kind"`
	// PodTemplates are paths to pod templates (metadata and spec).
	PodTemplates []string `json:"podTemplates,omitempty"`
	// PodSpecs are paths to pod specs.
	PodSpecs []string `json:"podSpecs,omitempty"`
	// Containers are paths to containers, or lists of them: the containers
	// a path finds in one object make one pod.
	Containers []string `json:"containers,omitempty"`
	// Tolerate are the fields the kind's CRD defines beside a pod spec or a
	// container (Knative's containerConcurrency, a Tekton step's script),
	// left out before the pod spec is decoded; any other unknown field is
	// still an error, so that a typo is not judged as if it were absent.
	Tolerate []string `json:"tolerate,omitempty"`
	// convert is a kind's own conversion to pod templates (Argo, Tekton,
	// Spark, KServe, TrainJob), instead of the paths.
	convert func(obj map[string]any) []extract
}

// KindsFile is what --kinds reads: kinds beside (or instead of) the built-in ones.
type KindsFile struct {
	Kinds []Kind `json:"kinds"`
}

// Kinds is a table of kinds, keyed by group/kind.
type Kinds map[string]*Kind

func kindKey(group, kind string) string { return group + "/" + kind }

// Lookup is the kind of an apiVersion and kind, or nil.
func (ks Kinds) Lookup(apiVersion, kind string) *Kind {
	group, _, ok := strings.Cut(apiVersion, "/")
	if !ok {
		group = ""
	}
	return ks[kindKey(group, kind)]
}

// BuiltinKinds is the table of the GPU job kinds gpuguard knows.
func BuiltinKinds() Kinds {
	ks := Kinds{}
	for _, k := range builtinKinds {
		k := k
		ks[kindKey(k.Group, k.Kind)] = &k
	}
	return ks
}

// List is the table's kinds, sorted by group and kind.
func (ks Kinds) List() []*Kind {
	out := make([]*Kind, 0, len(ks))
	for _, k := range ks {
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b *Kind) int { return strings.Compare(kindKey(a.Group, a.Kind), kindKey(b.Group, b.Kind)) })
	return out
}

// LoadKinds adds the kinds of a --kinds file to the table; a kind it names
// again replaces the built-in one.
func (ks Kinds) LoadKinds(file string) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var f KindsFile
	if err := sigsyaml.UnmarshalStrict(data, &f); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	for i, k := range f.Kinds {
		if k.Kind == "" {
			return fmt.Errorf("%s: kinds[%d]: kind is required", file, i)
		}
		if len(k.PodTemplates)+len(k.PodSpecs)+len(k.Containers) == 0 {
			return fmt.Errorf("%s: kinds[%d] (%s): name podTemplates, podSpecs or containers", file, i, k.Kind)
		}
		k := k
		ks[kindKey(k.Group, k.Kind)] = &k
	}
	return nil
}

// extract is a pod template built from an object, before decoding: where it
// sits, and where the fields of the pod came from.
type extract struct {
	path     string
	template map[string]any
	origins  []Origin
	// err is why no pod could be built (a podSpecPatch that does not parse).
	err error
}

// Origin maps a field of the pod template built (From, such as
// template.spec.containers[0]) to where it sits in the object (To, such as
// spec.templates[0].container).
type Origin struct{ From, To string }

// SourcePath is where a field of the judged pod template (a finding's path,
// template.spec.containers[0].env[1]) sits in the object, when known;
// else the template's own path.
func (t *EmbeddedPodTemplate) SourcePath(p string) string {
	best := -1
	for i, o := range t.Origins {
		if (p == o.From || strings.HasPrefix(p, o.From+".") || strings.HasPrefix(p, o.From+"[")) &&
			(best < 0 || len(o.From) > len(t.Origins[best].From)) {
			best = i
		}
	}
	if best < 0 {
		return strings.TrimPrefix(t.Path, ".")
	}
	return t.Origins[best].To + strings.TrimPrefix(p, t.Origins[best].From)
}

// PodTemplatesOf finds the pod templates of an object of a kind in the
// table, or, for any other kind, wherever they sit (PodTemplates). known
// says whether the kind is in the table.
func (ks Kinds) PodTemplatesOf(apiVersion, kind string, raw []byte) (found []EmbeddedPodTemplate, known bool, err error) {
	k := ks.Lookup(apiVersion, kind)
	if k == nil {
		found, err = PodTemplates(raw)
		return found, false, err
	}
	var tree map[string]any
	if err := sigsyaml.Unmarshal(raw, &tree); err != nil {
		return nil, true, err
	}
	var exs []extract
	if k.convert != nil {
		exs = k.convert(tree)
	} else {
		exs = k.extracts(tree)
	}
	if len(exs) == 0 && k.convert == nil {
		// A path the table does not know (a newer version of the CRD):
		// the walker still finds what looks like a template.
		found, err = PodTemplates(raw)
		return found, true, err
	}
	var errs []error
	for _, ex := range exs {
		if ex.err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", ex.path, ex.err))
			continue
		}
		t, err := decodeTemplate(ex.template, k.Tolerate)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", ex.path, err))
			continue
		}
		found = append(found, EmbeddedPodTemplate{Path: ex.path, Template: t, Origins: ex.origins})
	}
	return found, true, errors.Join(errs...)
}

// extracts follows the kind's paths in an object.
func (k *Kind) extracts(tree map[string]any) []extract {
	var out []extract
	for _, p := range k.PodTemplates {
		for _, h := range match(tree, p) {
			m, ok := h.v.(map[string]any)
			if !ok {
				continue
			}
			tmpl := map[string]any{"spec": m["spec"]}
			if md, ok := m["metadata"]; ok {
				tmpl["metadata"] = md
			}
			for key := range m {
				if key != "spec" && key != "metadata" && !slices.Contains(k.Tolerate, key) {
					tmpl[key] = m[key] // an unknown field, an error when decoded
				}
			}
			out = append(out, extract{path: h.path, template: tmpl, origins: []Origin{{"template", trimDot(h.path)}}})
		}
	}
	for _, p := range k.PodSpecs {
		for _, h := range match(tree, p) {
			if m, ok := h.v.(map[string]any); ok {
				out = append(out, extract{path: h.path, template: map[string]any{"spec": m},
					origins: []Origin{{"template.spec", trimDot(h.path)}}})
			}
		}
	}
	for _, p := range k.Containers {
		var containers []any
		var origins []Origin
		first := ""
		for _, h := range match(tree, p) {
			add := func(c any, at string) {
				if first == "" {
					first = at
				}
				origins = append(origins, Origin{fmt.Sprintf("template.spec.containers[%d]", len(containers)), trimDot(at)})
				containers = append(containers, c)
			}
			switch v := h.v.(type) {
			case map[string]any:
				add(v, h.path)
			case []any:
				for i, c := range v {
					add(c, h.path+"["+strconv.Itoa(i)+"]")
				}
			}
		}
		if len(containers) > 0 {
			at := first
			if len(containers) > 1 || !strings.Contains(p, "*") {
				at = "." + strings.ReplaceAll(p, "[*]", "")
			}
			out = append(out, extract{path: at, template: map[string]any{"spec": map[string]any{"containers": containers}}, origins: origins})
		}
	}
	return out
}

func trimDot(p string) string { return strings.TrimPrefix(p, ".") }

// decodeTemplate decodes a pod template strictly, once the tolerated fields
// beside its pod spec and containers are left out.
func decodeTemplate(tmpl map[string]any, tolerate []string) (corev1.PodTemplateSpec, error) {
	var pt corev1.PodTemplateSpec
	if len(tolerate) > 0 {
		if spec, ok := tmpl["spec"].(map[string]any); ok {
			spec = without(spec, tolerate...)
			for _, key := range []string{"containers", "initContainers"} {
				if list, ok := spec[key].([]any); ok {
					clean := make([]any, len(list))
					for i, c := range list {
						if m, ok := c.(map[string]any); ok {
							clean[i] = without(m, tolerate...)
						} else {
							clean[i] = c
						}
					}
					spec[key] = clean
				}
			}
			tmpl = maps1(tmpl, "spec", spec)
		}
	}
	data, err := json.Marshal(tmpl)
	if err != nil {
		return pt, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&pt); err != nil {
		return pt, fmt.Errorf("not a pod template: %w", err)
	}
	return pt, nil
}

// without is a copy of m without the keys.
func without(m map[string]any, keys ...string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		if !slices.Contains(keys, k) {
			out[k] = v
		}
	}
	return out
}

// maps1 is a copy of m with key set to v.
func maps1(m map[string]any, key string, v any) map[string]any {
	out := without(m)
	out[key] = v
	return out
}

type hit struct {
	path string
	v    any
}

// match follows a path pattern (a.b[*].c, a.*.template) in a tree, and
// returns the values found and their concrete paths (.a.b[0].c).
func match(tree any, pattern string) []hit {
	hits := []hit{{"", tree}}
	for _, step := range patternSteps(pattern) {
		var next []hit
		for _, h := range hits {
			switch {
			case step == "[*]":
				if list, ok := h.v.([]any); ok {
					for i, v := range list {
						next = append(next, hit{h.path + "[" + strconv.Itoa(i) + "]", v})
					}
				}
			case step == "*":
				if m, ok := h.v.(map[string]any); ok {
					keys := make([]string, 0, len(m))
					for k := range m {
						keys = append(keys, k)
					}
					slices.Sort(keys)
					for _, k := range keys {
						next = append(next, hit{h.path + "." + k, m[k]})
					}
				}
			case strings.HasPrefix(step, "["):
				i, _ := strconv.Atoi(strings.Trim(step, "[]"))
				if list, ok := h.v.([]any); ok && i >= 0 && i < len(list) {
					next = append(next, hit{h.path + step, list[i]})
				}
			default:
				if m, ok := h.v.(map[string]any); ok {
					if v, ok := m[step]; ok && v != nil {
						next = append(next, hit{h.path + "." + step, v})
					}
				}
			}
		}
		hits = next
	}
	return hits
}

// patternSteps splits a.b[*].c into a, b, [*], c.
func patternSteps(p string) []string {
	var steps []string
	for _, part := range strings.Split(strings.TrimPrefix(p, "."), ".") {
		for part != "" {
			i := strings.IndexByte(part, '[')
			switch {
			case i < 0:
				steps = append(steps, part)
				part = ""
			case i > 0:
				steps = append(steps, part[:i])
				part = part[i:]
			default:
				end := strings.IndexByte(part, ']')
				if end < 0 {
					steps = append(steps, part)
					part = ""
					continue
				}
				steps = append(steps, part[:end+1])
				part = part[end+1:]
			}
		}
	}
	return steps
}
