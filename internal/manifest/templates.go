package manifest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	sigsyaml "sigs.k8s.io/yaml"
)

// EmbeddedPodTemplate is a pod template inside an object of a kind gpuguard
// does not know: the replica specs of a Kubeflow PyTorchJob or MPIJob, a
// JobSet's replicated Jobs, a RayCluster's head and worker groups (also
// inside a RayJob or RayService), a LeaderWorkerSet's templates, a Volcano
// Job's tasks. Path says where it sits, as .spec.pytorchReplicaSpecs.Worker.template.
type EmbeddedPodTemplate struct {
	Path     string
	Template corev1.PodTemplateSpec
	// Origins map the fields of Template to where they sit in the object,
	// for a template built from other fields (an Argo template's
	// container, a SparkApplication's driver); see SourcePath.
	Origins []Origin
}

// PodTemplates finds the pod templates in one object, wherever they sit: any
// map whose spec has a list of containers, not looked inside further. The
// operators of such kinds create pods from them, so they are judged as
// templates are. Found in a stable order; a template that does not decode
// as a pod template (an unknown or mistyped field) is an error naming it.
func PodTemplates(raw []byte) ([]EmbeddedPodTemplate, error) {
	var tree map[string]any
	if err := sigsyaml.Unmarshal(raw, &tree); err != nil {
		return nil, err
	}
	var out []EmbeddedPodTemplate
	var errs []error
	walkTemplates(tree, "", func(at string, tmpl map[string]any) {
		data, err := json.Marshal(tmpl)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", at, err))
			return
		}
		var pt corev1.PodTemplateSpec
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&pt); err != nil {
			errs = append(errs, fmt.Errorf("%s: not a pod template: %w", at, err))
			return
		}
		out = append(out, EmbeddedPodTemplate{Path: at, Template: pt, Origins: []Origin{{"template", strings.TrimPrefix(at, ".")}}})
	})
	if len(errs) > 0 {
		return out, fmt.Errorf("%v", errs)
	}
	return out, nil
}

// walkTemplates calls found for every map whose spec has containers, and
// does not look inside it; map keys are walked in sorted order.
func walkTemplates(v any, at string, found func(at string, tmpl map[string]any)) {
	switch v := v.(type) {
	case map[string]any:
		if spec, ok := v["spec"].(map[string]any); ok {
			if _, ok := spec["containers"].([]any); ok {
				tmpl := map[string]any{"spec": spec}
				if m, ok := v["metadata"]; ok && m != nil {
					tmpl["metadata"] = m
				}
				found(at, tmpl)
				return
			}
		}
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			walkTemplates(v[k], at+"."+k, found)
		}
	case []any:
		for i, child := range v {
			walkTemplates(child, at+"["+strconv.Itoa(i)+"]", found)
		}
	}
}
