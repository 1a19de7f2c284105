//go:build upstream

package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	sigsyaml "sigs.k8s.io/yaml"

	"github.com/gpuguard/gpuguard/tools/upstreamchart"
)

// mlSample is an upstream file holding samples of an ML job kind, fetched
// as its project's Go module at a pinned version.
type mlSample struct {
	kind   string
	source upstreamchart.Source
	file   string // in source.Dir
	// markdown: the samples are the file's yaml code blocks (JobSet's module
	// ships no example files; its KEPs carry the samples).
	markdown bool
}

func mlSamples() []mlSample {
	return []mlSample{
		{kind: "PyTorchJob", file: "pytorch/simple.yaml", source: upstreamchart.Source{Module: "github.com/kubeflow/training-operator",
			Version: "v1.8.1", Sum: "h1:mVvoBSCInbMBX0gGSn4+Ihj3ycwoLO1iEAw+0qPhQfc=", Dir: "examples"}},
		{kind: "JobSet", file: "104-StartupPolicy/README.md", markdown: true, source: upstreamchart.Source{Module: "sigs.k8s.io/jobset",
			Version: "v0.10.1", Sum: "h1:u8QKifNsrWVrlRFe6w2ofYTqFT9ma2DRHxfeB2m9xyU=", Dir: "keps"}},
		{kind: "RayJob", file: "ray-job.sample.yaml", source: upstreamchart.Source{Module: "github.com/ray-project/kuberay/ray-operator",
			Version: "v1.5.0", Sum: "h1:KCjCQ7PSsvs9Ke+90CZbbs498nuaIJ/JkXk4vd54EVg=", Dir: "config/samples"}},
	}
}

// TestCheckOnUpstreamMLSamples: `gpuguard check` on the ML job samples their
// projects publish admits them as they are (exit 0), and exits 1, naming
// device-env, once NVIDIA_VISIBLE_DEVICES=all is added to their containers:
// the pod templates inside a PyTorchJob, a JobSet and a RayJob are judged as
// the pods their operators create.
func TestCheckOnUpstreamMLSamples(t *testing.T) {
	for _, s := range mlSamples() {
		t.Run(s.kind, func(t *testing.T) {
			docs := sampleDocs(t, s)
			if len(docs) == 0 {
				t.Fatalf("%s %s has no %s: the test's source is out of date", s.source, s.file, s.kind)
			}
			for i, doc := range docs {
				if r := gpuguard(t, doc, "check", "-"); r.code != 0 {
					t.Errorf("%s sample %d as published: exit %d, want 0\n%s%s", s.kind, i+1, r.code, r.stdout, r.stderr)
				}
				leaking := withEnvEverywhere(t, doc)
				r := gpuguard(t, leaking, "check", "-")
				if r.code != 1 || !regexp.MustCompile(`DENY\s+`+s.kind+` `).MatchString(r.stdout) || !strings.Contains(r.stdout, "[device-env]") {
					t.Errorf("%s sample %d with NVIDIA_VISIBLE_DEVICES=all: exit %d, want 1 and a device-env denial\n%s%s", s.kind, i+1, r.code, r.stdout, r.stderr)
				}
			}
		})
	}
}

var yamlBlock = regexp.MustCompile("(?s)```yaml\n(.*?)```")

// sampleDocs are the documents of the sample's kind in its file.
func sampleDocs(t *testing.T, s mlSample) []string {
	t.Helper()
	dir, err := upstreamchart.Download(context.Background(), s.source)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(s.source.Dir), filepath.FromSlash(s.file)))
	if err != nil {
		t.Fatal(err)
	}
	var candidates []string
	if s.markdown {
		for _, m := range yamlBlock.FindAllStringSubmatch(string(data), -1) {
			candidates = append(candidates, m[1])
		}
	} else {
		candidates = strings.Split(string(data), "\n---")
	}
	var docs []string
	for _, c := range candidates {
		var obj struct {
			Kind string `json:"kind"`
		}
		if sigsyaml.Unmarshal([]byte(c), &obj) == nil && obj.Kind == s.kind {
			docs = append(docs, c)
		}
	}
	return docs
}

// withEnvEverywhere adds NVIDIA_VISIBLE_DEVICES=all to every container of
// every pod template in doc, wherever the kind keeps them.
func withEnvEverywhere(t *testing.T, doc string) string {
	t.Helper()
	var obj any
	if err := sigsyaml.Unmarshal([]byte(doc), &obj); err != nil {
		t.Fatal(err)
	}
	if n := addEnv(obj); n == 0 {
		t.Fatal("the sample has no container")
	}
	out, err := sigsyaml.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

func addEnv(v any) (containers int) {
	switch v := v.(type) {
	case map[string]any:
		for k, child := range v {
			if list, ok := child.([]any); ok && (k == "containers" || k == "initContainers") {
				for _, c := range list {
					if c, ok := c.(map[string]any); ok {
						env, _ := c["env"].([]any)
						c["env"] = append(env, map[string]any{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"})
						containers++
					}
				}
				continue
			}
			containers += addEnv(child)
		}
	case []any:
		for _, child := range v {
			containers += addEnv(child)
		}
	}
	return containers
}
