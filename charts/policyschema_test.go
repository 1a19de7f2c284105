package charts

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"reflect"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuguard/gpuguard/config"
)

const schemaPath = "gpuguard/values.schema.json"

// specSpan finds the bytes of policy.properties.spec's value in a JSON
// Schema document, from just after its key (the colon included) to its end,
// so that it can be replaced without touching the rest of the file.
func specSpan(data []byte) (start, end int, err error) {
	want := "properties/policy/properties/spec"
	dec := json.NewDecoder(bytes.NewReader(data))
	var stack []*jsonFrame
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return 0, 0, errors.New("policy.properties.spec not found")
		}
		if err != nil {
			return 0, 0, err
		}
		if d, ok := tok.(json.Delim); ok && (d == '{' || d == '[') {
			stack = append(stack, &jsonFrame{object: d == '{', wantKey: d == '{'})
			continue
		}
		if _, ok := tok.(json.Delim); ok {
			stack = stack[:len(stack)-1]
		} else if top := stack[len(stack)-1]; top.object && top.wantKey {
			top.key, top.wantKey = tok.(string), false
			if keyPath(stack) == want {
				start = int(dec.InputOffset())
				var raw json.RawMessage
				if err := dec.Decode(&raw); err != nil {
					return 0, 0, err
				}
				return start, int(dec.InputOffset()), nil
			}
			continue
		}
		// A value is complete: its object waits for the next key.
		if len(stack) > 0 && stack[len(stack)-1].object {
			stack[len(stack)-1].wantKey = true
		}
	}
}

// jsonFrame is an object or array being read; an object's key is the one
// whose value comes next or is being read.
type jsonFrame struct {
	object, wantKey bool
	key             string
}

// keyPath joins the keys of the objects being read.
func keyPath(stack []*jsonFrame) string {
	var keys []string
	for _, f := range stack {
		if f.object {
			keys = append(keys, f.key)
		}
	}
	return strings.Join(keys, "/")
}

// TestPolicySpecSchemaIsGenerated: the schema of policy.spec in
// values.schema.json is the one derived from the policy's Go types
// (go test ./charts -update rewrites it).
func TestPolicySpecSchemaIsGenerated(t *testing.T) {
	data, err := os.ReadFile(schemaPath)
	if err != nil {
		t.Fatal(err)
	}
	start, end, err := specSpan(data)
	if err != nil {
		t.Fatal(err)
	}
	// The span starts at the colon after the key.
	valueStart := start + bytes.IndexByte(data[start:end], ':') + 1
	var got any
	if err := json.Unmarshal(data[valueStart:end], &got); err != nil {
		t.Fatal(err)
	}
	want := config.SpecJSONSchema()
	wantJSON, err := json.MarshalIndent(want, "        ", "  ")
	if err != nil {
		t.Fatal(err)
	}
	var wantValue any
	if err := json.Unmarshal(wantJSON, &wantValue); err != nil {
		t.Fatal(err)
	}
	if reflect.DeepEqual(got, wantValue) {
		return
	}
	if !*update {
		t.Fatalf("policy.spec in %s is not the schema of config.PolicySpec: run go test ./charts -update", schemaPath)
	}
	out := append(bytes.Clone(data[:start]), ": "...)
	out = append(append(out, wantJSON...), data[end:]...)
	if err := os.WriteFile(schemaPath, out, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestMistypedPolicyFailsInstall: a typo in policy.spec, or a value outside
// an enumeration, fails helm install (the schema) with the field's name,
// before anything reaches the cluster.
func TestMistypedPolicyFailsInstall(t *testing.T) {
	c := loadChart(t)
	for value, want := range map[string]string{
		"injectVoidd: false": "injectVoidd",
		"action: remove":     "action",
		"exemptions: {serviceAccounts: [{namespace: a, nam: b}]}":      "nam",
		"env: {protectedVariables: [{name: X, allowOnGPU: true}]}":     "allowOnGPU",
		"advisories: {privileged: block}":                              "privileged",
		"gpuResources: nvidia.com/gpu":                                 "gpuResources",
		"annotations: {deniedPrefixes: [cdi.k8s.io/], deniedKey: [x]}": "deniedKey",
	} {
		_, err := render(t, c, parseValues(t, "policy:\n  spec: {"+value+"}\n"))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("policy.spec {%s}: %v, want an error naming %s", value, err, want)
		}
	}
	if _, err := render(t, c, parseValues(t, "policy:\n  spec: {mode: warn, injectVoid: true, gpuResources: [nvidia.com/gpu]}\n")); err != nil {
		t.Errorf("a valid spec: %v", err)
	}
}

// TestPolicyCheckHook: before install and upgrade, a Job runs gpuguard check
// on exactly the policy the release writes into its ConfigMap.
func TestPolicyCheckHook(t *testing.T) {
	c := loadChart(t)
	objs := decodeAll(t, docs(renderCaseValues(t, c, cases[0]), true))
	var policyCM, hookCM *corev1.ConfigMap
	for _, cm := range findAll[*corev1.ConfigMap](objs) {
		switch {
		case strings.HasSuffix(cm.Name, "-policy-check"):
			hookCM = cm
		case strings.HasSuffix(cm.Name, "-policy"):
			policyCM = cm
		}
	}
	if policyCM == nil || hookCM == nil || hookCM.Data["policy.yaml"] != policyCM.Data["policy.yaml"] {
		t.Fatalf("the hook must check the release's own policy document")
	}
	job := one[*batchv1.Job](t, objs)
	if hooks := job.Annotations["helm.sh/hook"]; hooks != "pre-install,pre-upgrade" {
		t.Errorf("hook %q", hooks)
	}
	if args := job.Spec.Template.Spec.Containers[0].Args; strings.Join(args, " ") != "check --policy /policy/policy.yaml" {
		t.Errorf("args %v", args)
	}
	if job.Spec.BackoffLimit == nil || *job.Spec.BackoffLimit != 0 {
		t.Error("a failed check must not be retried")
	}
	if _, err := config.Load("hook", []byte(hookCM.Data["policy.yaml"])); err != nil {
		t.Errorf("the default policy does not load: %v", err)
	}
	off, err := render(t, c, parseValues(t, "policy:\n  checkHook: {enabled: false}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(findAll[*batchv1.Job](decodeAll(t, docs(off, true)))); n != 0 {
		t.Errorf("%d Jobs with the hook off", n)
	}
}
