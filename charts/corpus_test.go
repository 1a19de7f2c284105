//go:build upstream

package charts

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/internal/manifest"
	"github.com/gpuguard/gpuguard/policy"
	"github.com/gpuguard/gpuguard/tools/chartrender"
	"github.com/gpuguard/gpuguard/tools/upstreamchart"
)

// corpusSource is a benign upstream project at a pinned version: a chart
// rendered with its defaults, or a directory of example manifests, whose
// workloads (the pod templates of CRD-wrapped ones included) must all pass
// the default policy.
type corpusSource struct {
	name    string
	source  upstreamchart.Source
	ns      string
	values  map[string]any
	samples bool // source.Dir holds example manifests, not a chart
}

func promChart(dir string) upstreamchart.Source {
	return upstreamchart.Source{Module: "github.com/prometheus-community/helm-charts", Version: "v0.0.0-20260828105119-ed5d7d9b5933",
		Sum: "h1:5+f9HcKpurn9DWdl0b8PsT7TkEzfCDwcx2KbWYnrnPU=", Dir: "charts/" + dir}
}

func corpusSources() []corpusSource {
	return []corpusSource{
		{name: "metrics-server", ns: "kube-system-addons", source: upstreamchart.Source{Module: "sigs.k8s.io/metrics-server", Version: "v0.9.0",
			Sum: "h1:nlqqZ2H0Xfko8eJC/1qaNVVT17hu4rxndkOi22KTZ4w=", Dir: "charts/metrics-server"}},
		{name: "cert-manager", ns: "cert-manager", source: upstreamchart.Source{Module: "github.com/cert-manager/cert-manager", Version: "v1.21.2",
			Sum: "h1:UWgoYM+KLNtRlqmoWOKjKBOBUPVHeepQ6/ac3ERJW68=", Dir: "deploy/charts/cert-manager"}},
		{name: "ingress-nginx", ns: "ingress-nginx", source: upstreamchart.Source{Module: "k8s.io/ingress-nginx", Version: "v0.0.0-20240708192948-52c50467d67d",
			Sum: "h1:tZui5g6S4GO1hxLm6yrEoIXLkl4QfeGytlmZqZ+DmdQ=", Dir: "charts/ingress-nginx"}},
		{name: "kueue", ns: "kueue-system", source: upstreamchart.Source{Module: "sigs.k8s.io/kueue", Version: "v0.17.0",
			Sum: "h1:7hzb38M4eKGzYW+CFv2s1L+swzzacUCHOCXxZmAV90I=", Dir: "charts/kueue"}},
		{name: "gatekeeper", ns: "gatekeeper-system", source: upstreamchart.Source{Module: "github.com/open-policy-agent/gatekeeper/v3", Version: "v3.23.1",
			Sum: "h1:njHTm0SJ6ZEhhEgmQTpJKTGQbc99fSs4hGiEp1OIKck=", Dir: "charts/gatekeeper"}},
		{name: "kyverno", ns: "kyverno", source: upstreamchart.Source{Module: "github.com/kyverno/kyverno", Version: "v1.19.1",
			Sum: "h1:/MkgFii3/VlQfKR1JpC9tVwNNVNQTt2S4U6qCsafsTU=", Dir: "charts/kyverno"}},
		{name: "kubeflow-trainer", ns: "kubeflow-system", source: trainer("charts/kubeflow-trainer")},
		{name: "kubeflow-trainer runtimes", ns: "team-ml", source: trainer("manifests/base/runtimes"), samples: true},
		{name: "kuberay samples", ns: "team-ml", source: upstreamchart.Source{Module: "github.com/ray-project/kuberay/ray-operator", Version: "v1.5.0",
			Sum: "h1:KCjCQ7PSsvs9Ke+90CZbbs498nuaIJ/JkXk4vd54EVg=", Dir: "config/samples"}, samples: true},
		{name: "kube-state-metrics", ns: "monitoring", source: promChart("kube-state-metrics")},
		{name: "prometheus", ns: "monitoring", source: promChart("prometheus")},
		{name: "prometheus-adapter", ns: "monitoring", source: promChart("prometheus-adapter")},
		{name: "prometheus-pushgateway", ns: "monitoring", source: promChart("prometheus-pushgateway")},
		{name: "prometheus-blackbox-exporter", ns: "monitoring", source: promChart("prometheus-blackbox-exporter")},
	}
}

func trainer(dir string) upstreamchart.Source {
	return upstreamchart.Source{Module: "github.com/kubeflow/trainer/v2", Version: "v2.0.0",
		Sum: "h1:mnQSR9iPKItxyUR8mq66XsmxqKNVHwr9YYOB7BTU9dU=", Dir: dir}
}

// TestUpstreamWorkloadCorpus: every workload of these benign projects, as
// their charts render and their examples ship, is admitted by the default
// policy, and no container with a GPU limit is given void.
func TestUpstreamWorkloadCorpus(t *testing.T) {
	engine, err := policy.New(config.Default())
	if err != nil {
		t.Fatal(err)
	}
	total, gpuContainers := 0, 0
	for _, src := range corpusSources() {
		t.Run(src.name, func(t *testing.T) {
			pods := corpusPods(t, src)
			if len(pods) == 0 {
				t.Fatalf("%s gave no workload: the test's source is out of date", src.source)
			}
			total += len(pods)
			for name, pod := range pods {
				r := admit(t, engine, pod, src.ns, pod.Spec.ServiceAccountName)
				if !r.Allowed {
					t.Errorf("%s: denied: %v", name, r.Violations)
					continue
				}
				gpuContainers += checkGPUContainersUntouched(t, name, pod, r)
			}
		})
	}
	t.Logf("%d workloads judged, %d GPU containers among them", total, gpuContainers)
	if gpuContainers == 0 {
		t.Error("no GPU container in the corpus: the check that none is given void proves nothing")
	}
}

// corpusPods renders or reads a source and returns the pods its workloads
// would create, by "file or kind/name: path".
func corpusPods(t *testing.T, src corpusSource) map[string]*corev1.Pod {
	t.Helper()
	pods := map[string]*corev1.Pod{}
	if !src.samples {
		c, err := upstreamchart.Fetch(context.Background(), src.source)
		if err != nil {
			t.Fatal(err)
		}
		r, err := chartrender.Render(c, src.name, src.ns, src.values)
		if err != nil {
			t.Fatalf("rendering %s: %v", src.source, err)
		}
		for _, m := range r.Manifests {
			addTemplates(t, pods, "", []byte(m.Content))
		}
		return pods
	}
	dir, err := upstreamchart.Download(context.Background(), src.source)
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, filepath.FromSlash(src.source.Dir))
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !(strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml")) {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		for i, doc := range strings.Split(string(data), "\n---") {
			addTemplates(t, pods, rel+"#"+strconv.Itoa(i+1)+" ", []byte(doc))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pods
}

// addTemplates finds the pod templates in one document, wherever they sit
// (a Deployment's spec.template, a RayCluster's workerGroupSpecs, a
// TrainingRuntime's replicated Jobs), as the pods their operators create,
// named prefix + Kind/name, then where the template sits unless it is the
// usual spec.template.
func addTemplates(t *testing.T, pods map[string]*corev1.Pod, prefix string, doc []byte) {
	t.Helper()
	var obj struct {
		Kind     string `json:"kind"`
		Metadata struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if sigsyaml.Unmarshal(doc, &obj) != nil || obj.Kind == "" {
		return // not an object: Helm notes, Kustomize patches, comments
	}
	name := prefix + obj.Kind + "/" + obj.Metadata.Name
	found, err := manifest.PodTemplates(doc)
	if err != nil {
		t.Errorf("%s: %v", name, err)
	}
	for _, e := range found {
		pod := &corev1.Pod{ObjectMeta: e.Template.ObjectMeta, Spec: e.Template.Spec}
		if pod.Spec.ServiceAccountName == "" {
			pod.Spec.ServiceAccountName = "default"
		}
		at := e.Path
		if at == ".spec.template" {
			at = ""
		}
		pods[name+at] = pod
	}
}

// checkGPUContainersUntouched: the admission patch touches no container with
// a GPU limit; it returns how many there are.
func checkGPUContainersUntouched(t *testing.T, name string, pod *corev1.Pod, r policy.Result) int {
	t.Helper()
	after := pod
	if len(r.Patch) > 0 {
		patched, err := policy.ApplyPatch(pod, r.Patch)
		if err != nil {
			t.Fatal(err)
		}
		after = patched.(*corev1.Pod)
	}
	before := append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...)
	now := append(append([]corev1.Container{}, after.Spec.InitContainers...), after.Spec.Containers...)
	n := 0
	for i, c := range before {
		gpu := false
		for res, q := range c.Resources.Limits {
			gpu = gpu || (q.Sign() > 0 && strings.HasPrefix(string(res), "nvidia.com/"))
		}
		if !gpu {
			continue
		}
		n++
		if len(now[i].Env) != len(c.Env) {
			t.Errorf("%s: GPU container %s was patched: %v", name, c.Name, now[i].Env)
		}
	}
	return n
}

// TestCorpusKAIFractions: the corpus's KAI-shaped pods (KubeRay's GPU
// sharing sample), scheduled by KAI as KubeRay's KAI integration does, go
// through gpuguard's mutation, then KAI's admission (as KAI-Scheduler v0.17
// shapes it), then gpuguard's validation with the KAI integration on: they
// are admitted and their fraction container takes its GPU from KAI's
// ConfigMap, not void.
func TestCorpusKAIFractions(t *testing.T) {
	p := config.Default()
	p.Spec.Integrations.KAIScheduler = config.KAIScheduler{Fractions: true, SchedulerNames: []string{"kai-scheduler"}}
	engine, err := policy.New(p)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	found := 0
	for _, src := range corpusSources() {
		for name, pod := range corpusPods(t, src) {
			if _, ok := pod.Annotations[policy.KAIFractionAnnotation]; !ok {
				continue
			}
			found++
			pod.Namespace, pod.Spec.SchedulerName = src.ns, "kai-scheduler"
			mutated := engine.Evaluate(ctx, &policy.Request{Operation: "CREATE", Namespace: src.ns, Object: pod, Phase: policy.Mutating})
			obj, err := policy.ApplyPatch(pod, mutated.Patch)
			if err != nil {
				t.Fatal(err)
			}
			admitted := kaiAdmission(obj.(*corev1.Pod))
			final := engine.Evaluate(ctx, &policy.Request{Operation: "CREATE", Namespace: src.ns, Object: admitted, Phase: policy.Validating})
			if !mutated.Allowed || !final.Allowed {
				t.Errorf("%s: a KAI fraction pod must be admitted: %v %v", name, mutated.Violations, final.Violations)
			}
			if v, _ := policy.EffectiveEnv(&admitted.Spec.Containers[0], "NVIDIA_VISIBLE_DEVICES"); v.ValueFrom == nil {
				t.Errorf("%s: the fraction container ends with NVIDIA_VISIBLE_DEVICES=%q, not KAI's ConfigMap", name, v.Value)
			}
		}
	}
	if found == 0 {
		t.Error("no KAI-shaped pod in the corpus")
	}
}

// kaiAdmission does to a fraction pod what KAI Scheduler's admission does:
// names its ConfigMap prefix and replaces the fraction container's
// NVIDIA_VISIBLE_DEVICES (and adds its other variables) with references to
// PREFIX-0.
func kaiAdmission(pod *corev1.Pod) *corev1.Pod {
	pod = pod.DeepCopy()
	prefix := pod.Name + "-x7k2p9q" + policy.KAIConfigMapSuffix
	pod.Annotations[policy.KAIConfigMapAnnotation] = prefix
	c := &pod.Spec.Containers[0]
	for _, name := range []string{"NVIDIA_VISIBLE_DEVICES", "RUNAI_NUM_OF_GPUS", "GPU_PORTION"} {
		ref := corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: prefix + "-0"}, Key: name}}}
		replaced := false
		for i := range c.Env {
			if c.Env[i].Name == name {
				c.Env[i], replaced = ref, true
			}
		}
		if !replaced {
			c.Env = append(c.Env, ref)
		}
	}
	c.EnvFrom = append(c.EnvFrom, corev1.EnvFromSource{ConfigMapRef: &corev1.ConfigMapEnvSource{
		LocalObjectReference: corev1.LocalObjectReference{Name: prefix + "-0-evar"}, Optional: new(false)}})
	return pod
}

// TestCorpusHAMiShapes: every GPU container of the corpus, asking HAMi for
// GPU memory and cores instead of whole GPUs (as HAMi's users do, before
// HAMi's webhook adds nvidia.com/gpu), is admitted without void under the
// chart's hami preset.
func TestCorpusHAMiShapes(t *testing.T) {
	p := renderedEnforcingPolicy(t, loadChart(t), map[string]any{"policy": map[string]any{"presets": map[string]any{"hami": map[string]any{"enabled": true}}}})
	engine, err := policy.New(p)
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, src := range corpusSources() {
		for name, pod := range corpusPods(t, src) {
			if !toHAMi(pod) {
				continue
			}
			r := admit(t, engine, pod, src.ns, pod.Spec.ServiceAccountName)
			if !r.Allowed {
				t.Errorf("%s as a HAMi pod: denied: %v", name, r.Violations)
				continue
			}
			found += checkGPUContainersUntouched(t, name, pod, r)
		}
	}
	if found == 0 {
		t.Error("no HAMi-shaped GPU container: the check proves nothing")
	}
}

// toHAMi turns each container's nvidia.com/gpu limit into HAMi's GPU memory
// and cores; false when the pod has none.
func toHAMi(pod *corev1.Pod) bool {
	changed := false
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			lim := list[i].Resources.Limits
			if q, ok := lim["nvidia.com/gpu"]; ok && q.Sign() > 0 {
				delete(lim, "nvidia.com/gpu")
				lim["nvidia.com/gpumem"] = resource.MustParse("8000")
				lim["nvidia.com/gpucores"] = resource.MustParse("50")
				changed = true
			}
		}
	}
	return changed
}
