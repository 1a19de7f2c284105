package policy

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"

	jsonpatchapply "github.com/evanphx/json-patch/v5"
	"gomodules.xyz/jsonpatch/v2"
	"k8s.io/apimachinery/pkg/runtime"
)

// Admit runs a request through both phases, as the API server does: the mutating
// phase, its patch applied, then the validating phase on the patched object. The
// result carries the mutating patch and the warnings and audit annotations of both.
// A request denied by the mutating phase stops there.
func (e *Engine) Admit(ctx context.Context, req Request) (Result, error) {
	req.Phase = Mutating
	mutated := e.Evaluate(ctx, &req)
	if !mutated.Allowed {
		return mutated, nil
	}
	if len(mutated.Patch) > 0 {
		obj, err := ApplyPatch(req.Object, mutated.Patch)
		if err != nil {
			return Result{}, err
		}
		req.Object = obj
	}
	req.Phase = Validating
	final := e.Evaluate(ctx, &req)
	final.Patch = mutated.Patch
	final.Warnings = append(mutated.Warnings, final.Warnings...)
	if len(mutated.AuditAnnotations) > 0 {
		if final.AuditAnnotations == nil {
			final.AuditAnnotations = map[string]string{}
		}
		maps.Copy(final.AuditAnnotations, mutated.AuditAnnotations)
	}
	return final, nil
}

// ApplyPatch applies a JSON Patch to a copy of obj and returns the copy.
func ApplyPatch(obj runtime.Object, ops []jsonpatch.Operation) (runtime.Object, error) {
	doc, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("encoding object: %w", err)
	}
	raw, err := json.Marshal(ops)
	if err != nil {
		return nil, fmt.Errorf("encoding patch: %w", err)
	}
	patch, err := jsonpatchapply.DecodePatch(raw)
	if err != nil {
		return nil, fmt.Errorf("decoding patch: %w", err)
	}
	patched, err := patch.Apply(doc)
	if err != nil {
		return nil, fmt.Errorf("applying patch: %w", err)
	}
	out := reflect.New(reflect.TypeOf(obj).Elem()).Interface().(runtime.Object)
	if err := json.Unmarshal(patched, out); err != nil {
		return nil, fmt.Errorf("decoding patched object: %w", err)
	}
	return out, nil
}
