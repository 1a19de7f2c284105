package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuguard/gpuguard/internal/manifest"
)

// deniedAnnotation names, in a sample, where its denied pod sits.
const deniedAnnotation = "test.gpuguard.io/denied"

// TestCheckKinds: every GPU job kind of testdata/kinds is judged through
// the pods it describes, never skipped and never an input error: a sample
// named ok-* is allowed, and one named leak-* (a container given every GPU
// without a GPU limit) is denied by device-env at the field where its
// annotation says, on that field's line of the file.
func TestCheckKinds(t *testing.T) {
	files, _ := filepath.Glob("testdata/kinds/*.yaml")
	if len(files) < 6 {
		t.Fatalf("want the samples in testdata/kinds, found %v", files)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			o := &checkOptions{namespace: "default", out: outputOptions{format: "json", failOn: "deny,skip"}}
			err := o.run(context.Background(), []string{file}, nil, &stdout, &stderr)
			if ee, ok := err.(*exitError); err != nil && (!ok || ee.code != exitDenied) {
				t.Fatalf("check: %v\n%s", err, stderr.String())
			}
			if stderr.Len() > 0 {
				t.Errorf("check skipped or failed:\n%s", stderr.String())
			}
			var results []checkedObject
			if err := json.Unmarshal(stdout.Bytes(), &results); err != nil {
				t.Fatal(err)
			}
			docs, errs := manifest.Read([]string{file}, nil)
			if len(errs) > 0 {
				t.Fatal(errs)
			}
			src, _ := os.ReadFile(file)
			lines := strings.Split(string(src), "\n")
			for _, d := range docs {
				name := d.Meta.Name
				if name == "" {
					name = d.Meta.GenerateName + "*"
				}
				var mine []checkedObject
				for _, r := range results {
					if r.Error != "" {
						t.Errorf("input error: %s", r.Error)
					}
					if r.Kind == d.GVK.Kind && strings.HasPrefix(r.Name, name+".") {
						mine = append(mine, r)
					}
				}
				if len(mine) == 0 {
					t.Errorf("%s %s: no pod judged", d.GVK.Kind, name)
					continue
				}
				want := d.Meta.Annotations[deniedAnnotation]
				for _, r := range mine {
					switch {
					case strings.HasPrefix(name, "ok-") && (!r.Allowed || len(r.Violations) > 0):
						t.Errorf("%s %s: denied, want allowed: %+v", r.Kind, r.Name, r.Violations)
					case strings.HasPrefix(name, "leak-") && want != "" && len(r.Violations) > 0 && strings.HasPrefix(r.Violations[0].Path, want):
						if r.Allowed || len(r.Violations) == 0 || r.Violations[0].Rule != "device-env" {
							t.Errorf("%s %s: want a device-env denial, got allowed=%v %+v", r.Kind, r.Name, r.Allowed, r.Violations)
							continue
						}
						// The finding's line is its env entry's: NVIDIA_VISIBLE_DEVICES.
						// A podSpecPatch is a string: its key's line.
						line, text := d.FieldLines()(r.Violations[0].Path), "NVIDIA_VISIBLE_DEVICES"
						if strings.HasSuffix(r.Violations[0].Path, "podSpecPatch") {
							text = "podSpecPatch"
						}
						if line < 1 || line > len(lines) || !strings.Contains(lines[line-1], text) {
							t.Errorf("%s %s: %s at line %d, not on the NVIDIA_VISIBLE_DEVICES entry", r.Kind, r.Name, r.Violations[0].Path, line)
						}
						want = ""
					}
				}
				if strings.HasPrefix(name, "leak-") && want != "" {
					t.Errorf("%s %s: no denial at %s in %+v", d.GVK.Kind, name, want, mine)
				}
			}
		})
	}
}

func runCheck(t *testing.T, o *checkOptions, paths ...string) (code int, stdout, stderr string) {
	t.Helper()
	if o.namespace == "" {
		o.namespace = "default"
	}
	if o.out.format == "" {
		o.out.format, o.out.failOn = "text", "deny"
	}
	var out, errOut bytes.Buffer
	err := o.run(context.Background(), paths, nil, &out, &errOut)
	if ee, ok := err.(*exitError); ok {
		code = ee.code
		errOut.WriteString(ee.msg)
	} else if err != nil {
		t.Fatal(err)
	}
	return code, out.String(), errOut.String()
}

func writeTemp(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

const widget = `apiVersion: example.com/v1
kind: Widget
metadata: {name: w, namespace: team-a}
spec:
  runner:
    image: cuda
    env: [{name: NVIDIA_VISIBLE_DEVICES, value: all}]
    retries: 3
`

// TestCheckKindsFile: --kinds names a kind's containers, and a field it
// tolerates; --fail-on skip fails a run that skipped a document; --ignore
// leaves out what it matches, by file or KIND/NAMESPACE/NAME.
func TestCheckKindsFile(t *testing.T) {
	file := writeTemp(t, "widget.yaml", widget)
	if code, out, _ := runCheck(t, &checkOptions{}, file); code != 0 || !strings.Contains(out, "SKIP") {
		t.Errorf("an unknown kind: exit %d, want 0 and a SKIP\n%s", code, out)
	}
	o := &checkOptions{out: outputOptions{format: "text", failOn: "deny,skip"}}
	if code, _, errOut := runCheck(t, o, file); code != exitDenied || !strings.Contains(errOut, "--fail-on skip") {
		t.Errorf("--fail-on skip: exit %d, want 1\n%s", code, errOut)
	}
	kinds := writeTemp(t, "kinds.yaml", `kinds:
  - group: example.com
    kind: Widget
    containers: [spec.runner]
    tolerate: [retries]
`)
	code, out, errOut := runCheck(t, &checkOptions{kindsFile: kinds}, file)
	if code != exitDenied || !strings.Contains(out, "DENY    Widget team-a/w.spec.runner") || !strings.Contains(out, "spec.runner.env[0]") {
		t.Errorf("--kinds: exit %d, want a denial at spec.runner.env[0]\n%s%s", code, out, errOut)
	}
	for _, pattern := range []string{"Widget/team-a/*", "*.yaml", filepath.Dir(file)} {
		if code, out, _ := runCheck(t, &checkOptions{kindsFile: kinds, ignore: []string{pattern}}, file); code != 0 || strings.Contains(out, "Widget") {
			t.Errorf("--ignore %s: exit %d, want 0 and nothing judged\n%s", pattern, code, out)
		}
	}
	bad := writeTemp(t, "kinds.yaml", "kinds: [{group: example.com, kind: Widget, containrs: [spec.runner]}]\n")
	if code, _, errOut := runCheck(t, &checkOptions{kindsFile: bad}, file); code != exitUsage || !strings.Contains(errOut, "containrs") {
		t.Errorf("a --kinds typo: exit %d, want 2 naming it\n%s", code, errOut)
	}
}

// TestCheckKnownKindsStayStrict: the fields a CRD defines beside a pod spec
// are tolerated, a typo in the pod spec is not.
func TestCheckKnownKindsStayStrict(t *testing.T) {
	file := writeTemp(t, "ksvc.yaml", `apiVersion: serving.knative.dev/v1
kind: Service
metadata: {name: s}
spec:
  template:
    spec:
      containerConcurrency: 2
      containers:
        - image: nginx
          envv: [{name: NVIDIA_VISIBLE_DEVICES, value: all}]
`)
	if code, _, errOut := runCheck(t, &checkOptions{}, file); code != exitUsage || !strings.Contains(errOut, "envv") {
		t.Errorf("a typo in a Knative Service: exit %d, want 2 naming envv\n%s", code, errOut)
	}
}
