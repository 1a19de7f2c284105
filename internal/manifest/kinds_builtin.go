package manifest

import (
	"fmt"
	"slices"
	"strconv"

	sigsyaml "sigs.k8s.io/yaml"
)

// knativeExtra are the fields a Knative revision template's spec has
// beside the pod spec.
var knativeExtra = []string{"containerConcurrency", "timeoutSeconds", "responseStartTimeoutSeconds", "idleTimeoutSeconds"}

func replicaSpecs(group, kind, field string) Kind {
	return Kind{Group: group, Kind: kind, PodTemplates: []string{"spec." + field + ".*.template"}}
}

func rayCluster(at string) []string {
	return []string{at + ".headGroupSpec.template", at + ".workerGroupSpecs[*].template"}
}

// builtinKinds are the GPU job kinds of the projects teams run them with,
// from their CRDs' documented shapes.
var builtinKinds = []Kind{
	// Kubeflow training operator v1.
	replicaSpecs("kubeflow.org", "PyTorchJob", "pytorchReplicaSpecs"),
	replicaSpecs("kubeflow.org", "TFJob", "tfReplicaSpecs"),
	replicaSpecs("kubeflow.org", "MPIJob", "mpiReplicaSpecs"),
	replicaSpecs("kubeflow.org", "XGBoostJob", "xgbReplicaSpecs"),
	replicaSpecs("kubeflow.org", "PaddleJob", "paddleReplicaSpecs"),
	replicaSpecs("kubeflow.org", "JAXJob", "jaxReplicaSpecs"),
	// Kubeflow trainer v2.
	{Group: "trainer.kubeflow.org", Kind: "TrainJob", convert: trainJob},
	{Group: "trainer.kubeflow.org", Kind: "TrainingRuntime", PodTemplates: []string{"spec.template.spec.replicatedJobs[*].template.spec.template"}},
	{Group: "trainer.kubeflow.org", Kind: "ClusterTrainingRuntime", PodTemplates: []string{"spec.template.spec.replicatedJobs[*].template.spec.template"}},
	{Group: "jobset.x-k8s.io", Kind: "JobSet", PodTemplates: []string{"spec.replicatedJobs[*].template.spec.template"}},
	{Group: "leaderworkerset.x-k8s.io", Kind: "LeaderWorkerSet", PodTemplates: []string{
		"spec.leaderWorkerTemplate.leaderTemplate", "spec.leaderWorkerTemplate.workerTemplate"}},
	{Group: "batch.volcano.sh", Kind: "Job", PodTemplates: []string{"spec.tasks[*].template"}},
	{Group: "ray.io", Kind: "RayCluster", PodTemplates: rayCluster("spec")},
	{Group: "ray.io", Kind: "RayJob", PodTemplates: append(rayCluster("spec.rayClusterSpec"), "spec.submitterPodTemplate")},
	{Group: "ray.io", Kind: "RayService", PodTemplates: rayCluster("spec.rayClusterConfig")},
	// Knative Serving: a revision template's spec is a pod spec and the
	// revision's own fields.
	{Group: "serving.knative.dev", Kind: "Service", PodTemplates: []string{"spec.template"}, Tolerate: knativeExtra},
	{Group: "serving.knative.dev", Kind: "Configuration", PodTemplates: []string{"spec.template"}, Tolerate: knativeExtra},
	{Group: "serving.knative.dev", Kind: "Revision", PodSpecs: []string{"spec"}, Tolerate: knativeExtra},
	// KServe.
	{Group: "serving.kserve.io", Kind: "InferenceService", convert: inferenceService},
	{Group: "serving.kserve.io", Kind: "ServingRuntime", PodSpecs: []string{"spec"}, Tolerate: servingRuntimeExtra},
	{Group: "serving.kserve.io", Kind: "ClusterServingRuntime", PodSpecs: []string{"spec"}, Tolerate: servingRuntimeExtra},
	// Argo Workflows.
	{Group: "argoproj.io", Kind: "Workflow", convert: argoWorkflow("spec")},
	{Group: "argoproj.io", Kind: "WorkflowTemplate", convert: argoWorkflow("spec")},
	{Group: "argoproj.io", Kind: "ClusterWorkflowTemplate", convert: argoWorkflow("spec")},
	{Group: "argoproj.io", Kind: "CronWorkflow", convert: argoWorkflow("spec", "workflowSpec")},
	// Tekton Pipelines.
	{Group: "tekton.dev", Kind: "Task", convert: tektonTaskKind},
	{Group: "tekton.dev", Kind: "ClusterTask", convert: tektonTaskKind},
	{Group: "tekton.dev", Kind: "TaskRun", convert: tektonTaskRun},
	{Group: "tekton.dev", Kind: "Pipeline", convert: tektonPipeline},
	{Group: "tekton.dev", Kind: "PipelineRun", convert: tektonPipelineRun},
	// Spark operator.
	{Group: "sparkoperator.k8s.io", Kind: "SparkApplication", convert: sparkApplication("spec")},
	{Group: "sparkoperator.k8s.io", Kind: "ScheduledSparkApplication", convert: sparkApplication("spec", "template")},
}

var servingRuntimeExtra = []string{"supportedModelFormats", "multiModel", "disabled", "protocolVersions",
	"grpcEndpoint", "grpcDataEndpoint", "httpDataEndpoint", "replicas", "storageHelper", "builtInAdapter",
	"workerSpec", "labels", "annotations"}

func mapAt(m map[string]any, keys ...string) map[string]any {
	for _, k := range keys {
		next, ok := m[k].(map[string]any)
		if !ok {
			return nil
		}
		m = next
	}
	return m
}

func listAt(m map[string]any, keys ...string) []any {
	if len(keys) == 0 {
		return nil
	}
	parent := mapAt(m, keys[:len(keys)-1]...)
	list, _ := parent[keys[len(keys)-1]].([]any)
	return list
}

func index(at string, i int) string { return at + "[" + strconv.Itoa(i) + "]" }

// pod builds a pod template from a kind's fields, keeping where each came from.
type pod struct {
	meta    map[string]any
	spec    map[string]any
	origins []Origin
}

func newPod() *pod { return &pod{spec: map[string]any{}} }

// add appends a container (key containers or initContainers) that sits at from.
func (p *pod) add(key string, c any, from string) {
	list, _ := p.spec[key].([]any)
	p.origins = append(p.origins, Origin{index("template.spec."+key, len(list)), trimDot(from)})
	p.spec[key] = append(list, c)
}

// set sets a pod spec field, when v is set, from where it sits.
func (p *pod) set(field string, v any, from string) {
	if v == nil {
		return
	}
	p.spec[field] = v
	p.origins = append(p.origins, Origin{"template.spec." + field, trimDot(from)})
}

func (p *pod) has(key string) bool {
	list, _ := p.spec[key].([]any)
	return len(list) > 0
}

func (p *pod) extract(path string) extract {
	tmpl := map[string]any{"spec": p.spec}
	if p.meta != nil {
		tmpl["metadata"] = p.meta
	}
	origins := append([]Origin{{"template", trimDot(path)}}, p.origins...)
	return extract{path: path, template: tmpl, origins: origins}
}

// merge is a strategic merge of b onto a, as pod spec patches and
// templates are applied: maps merge, lists of named items merge by name,
// anything else is replaced.
func merge(a, b any) any {
	switch b := b.(type) {
	case map[string]any:
		am, ok := a.(map[string]any)
		if !ok {
			return b
		}
		out := without(am)
		for k, v := range b {
			out[k] = merge(am[k], v)
		}
		return out
	case []any:
		al, ok := a.([]any)
		if !ok || !named(al) || !named(b) {
			return b
		}
		out := slices.Clone(al)
		for _, item := range b {
			name := item.(map[string]any)["name"]
			i := slices.IndexFunc(out, func(x any) bool { return x.(map[string]any)["name"] == name })
			if i < 0 {
				out = append(out, item)
			} else {
				out[i] = merge(out[i], item)
			}
		}
		return out
	}
	return b
}

// overrideOrigins are where the env entries an override (a pod spec
// patch, a TrainJob's overrides) merged into spec came from: at, and
// within it the entry when inside is set (a patch written as a string has
// no fields of its own to point at).
func overrideOrigins(spec, override map[string]any, at string, inside bool) []Origin {
	var out []Origin
	byName := func(list []any, name any) int {
		return slices.IndexFunc(list, func(x any) bool { m, ok := x.(map[string]any); return ok && m["name"] == name })
	}
	for _, key := range []string{"containers", "initContainers"} {
		merged, _ := spec[key].([]any)
		for j, oc := range listAt(override, key) {
			ocm, ok := oc.(map[string]any)
			if !ok {
				continue
			}
			ci := byName(merged, ocm["name"])
			if ci < 0 {
				continue
			}
			env := listAt(merged[ci].(map[string]any), "env")
			for k, e := range listAt(ocm, "env") {
				em, ok := e.(map[string]any)
				if !ok {
					continue
				}
				to := at
				if inside {
					to = fmt.Sprintf("%s.%s[%d].env[%d]", at, key, j, k)
				}
				out = append(out, Origin{fmt.Sprintf("template.spec.%s[%d].env[%d]", key, ci, byName(env, em["name"])), trimDot(to)})
			}
		}
	}
	return out
}

// envOrigins are where the env entries of a container that came from
// src (a stepTemplate, a podTemplate) sit: at.env[k], unless over
// (the step) sets the variable itself.
func envOrigins(container string, merged, src, over map[string]any, at string) []Origin {
	var out []Origin
	env := listAt(merged, "env")
	for k, e := range listAt(src, "env") {
		name := mapName(e)
		if slices.ContainsFunc(listAt(over, "env"), func(x any) bool { return mapName(x) == name }) {
			continue
		}
		if i := slices.IndexFunc(env, func(x any) bool { return mapName(x) == name }); i >= 0 {
			out = append(out, Origin{fmt.Sprintf("%s.env[%d]", container, i), trimDot(index(at+".env", k))})
		}
	}
	return out
}

func mapName(x any) any {
	m, _ := x.(map[string]any)
	return m["name"]
}

func named(list []any) bool {
	for _, x := range list {
		m, ok := x.(map[string]any)
		if !ok || m["name"] == nil {
			return false
		}
	}
	return true
}

func withName(c map[string]any, name string) map[string]any {
	if c["name"] == nil {
		c = maps1(c, "name", name)
	}
	return c
}

// argoWorkflow judges each template of a workflow spec that runs a pod: its
// container or script (named main), containerSet, sidecars and init
// containers, with the pod fields of the template or else the workflow,
// and the workflow's and template's podSpecPatch applied.
func argoWorkflow(at ...string) func(map[string]any) []extract {
	base := ""
	for _, k := range at {
		base += "." + k
	}
	return func(obj map[string]any) []extract {
		wf := mapAt(obj, at...)
		var out []extract
		for i, t := range listAt(wf, "templates") {
			tm, ok := t.(map[string]any)
			if !ok {
				continue
			}
			tat := index(base+".templates", i)
			p := newPod()
			if c := mapAt(tm, "container"); c != nil {
				p.add("containers", withName(c, "main"), tat+".container")
			}
			if s := mapAt(tm, "script"); s != nil {
				p.add("containers", withName(without(s, "source"), "main"), tat+".script")
			}
			for j, c := range listAt(tm, "containerSet", "containers") {
				if c, ok := c.(map[string]any); ok {
					p.add("containers", without(c, "dependencies"), index(tat+".containerSet.containers", j))
				}
			}
			if !p.has("containers") {
				continue // steps, dag, resource, suspend, http: no pod of its own
			}
			for j, c := range listAt(tm, "sidecars") {
				if c, ok := c.(map[string]any); ok {
					p.add("containers", without(c, "mirrorVolumeMounts"), index(tat+".sidecars", j))
				}
			}
			for j, c := range listAt(tm, "initContainers") {
				if c, ok := c.(map[string]any); ok {
					p.add("initContainers", without(c, "mirrorVolumeMounts"), index(tat+".initContainers", j))
				}
			}
			var volumes []any
			volumes = append(volumes, listAt(wf, "volumes")...)
			volumes = append(volumes, listAt(tm, "volumes")...)
			if len(volumes) > 0 {
				from := base + ".volumes"
				if tm["volumes"] != nil {
					from = tat + ".volumes"
				}
				p.set("volumes", volumes, from)
			}
			for _, f := range []string{"securityContext", "nodeSelector", "tolerations", "affinity", "serviceAccountName",
				"schedulerName", "priorityClassName", "hostAliases", "automountServiceAccountToken", "hostNetwork", "dnsPolicy", "dnsConfig"} {
				if v, ok := tm[f]; ok {
					p.set(f, v, tat+"."+f)
				} else if v, ok := wf[f]; ok {
					p.set(f, v, base+"."+f)
				}
			}
			if md := mapAt(tm, "metadata"); md != nil {
				p.meta = md
			} else if md := mapAt(wf, "podMetadata"); md != nil {
				p.meta = md
			}
			ex := p.extract(tat)
			for _, patch := range []struct {
				v  any
				at string
			}{{wf["podSpecPatch"], base + ".podSpecPatch"}, {tm["podSpecPatch"], tat + ".podSpecPatch"}} {
				s, ok := patch.v.(string)
				if !ok {
					continue
				}
				var m map[string]any
				if err := sigsyaml.Unmarshal([]byte(s), &m); err != nil {
					ex.err = fmt.Errorf("%s: %w", trimDot(patch.at), err)
					break
				}
				ex.template["spec"] = merge(ex.template["spec"], m)
				ex.origins = append(ex.origins, overrideOrigins(ex.template["spec"].(map[string]any), m, patch.at, false)...)
			}
			out = append(out, ex)
		}
		return out
	}
}

// tektonStepExtra are a Tekton step's and sidecar's fields beside the container's.
var tektonStepExtra = []string{"script", "timeout", "onError", "stdoutConfig", "stderrConfig", "params", "results",
	"ref", "when", "displayName", "workspaces", "computeResources"}

// tektonContainer is a step or sidecar as the container Tekton runs it in:
// computeResources (v1) are its resources.
func tektonContainer(s map[string]any) map[string]any {
	c := without(s, tektonStepExtra...)
	if r, ok := s["computeResources"]; ok {
		c["resources"] = r
	}
	return c
}

// tektonTask is the pod of a task spec: its steps, each merged onto the
// stepTemplate, and sidecars; with a run's podTemplate, whose env every
// container gets.
func tektonTask(spec map[string]any, at string, podTemplate map[string]any, ptAt string) (extract, bool) {
	steps := listAt(spec, "steps")
	if len(steps) == 0 {
		return extract{}, false
	}
	p := newPod()
	tmpl := mapAt(spec, "stepTemplate")
	for i, s := range steps {
		sm, ok := s.(map[string]any)
		if !ok {
			continue
		}
		c := tektonContainer(sm)
		if tmpl != nil {
			c = merge(tektonContainer(tmpl), c).(map[string]any)
			p.origins = append(p.origins, envOrigins(index("template.spec.containers", i), c, tmpl, sm, at+".stepTemplate")...)
		}
		p.add("containers", withName(c, "unnamed-"+strconv.Itoa(i)), index(at+".steps", i))
	}
	for i, s := range listAt(spec, "sidecars") {
		if sm, ok := s.(map[string]any); ok {
			p.add("containers", tektonContainer(sm), index(at+".sidecars", i))
		}
	}
	p.set("volumes", spec["volumes"], at+".volumes")
	if podTemplate != nil {
		if env := listAt(podTemplate, "env"); len(env) > 0 {
			for _, key := range []string{"containers", "initContainers"} {
				list, _ := p.spec[key].([]any)
				for i, c := range list {
					cm := c.(map[string]any)
					list[i] = maps1(cm, "env", merge(cm["env"], env))
					p.origins = append(p.origins, envOrigins(index("template.spec."+key, i), list[i].(map[string]any), podTemplate, nil, ptAt)...)
				}
			}
		}
		for k, v := range without(podTemplate, "env") {
			p.set(k, merge(p.spec[k], v), ptAt+"."+k)
		}
	}
	return p.extract(at), true
}

func tektonTaskKind(obj map[string]any) []extract {
	if ex, ok := tektonTask(mapAt(obj, "spec"), ".spec", nil, ""); ok {
		return []extract{ex}
	}
	return nil
}

func tektonTaskRun(obj map[string]any) []extract {
	if ex, ok := tektonTask(mapAt(obj, "spec", "taskSpec"), ".spec.taskSpec", mapAt(obj, "spec", "podTemplate"), ".spec.podTemplate"); ok {
		return []extract{ex}
	}
	return nil
}

// tektonPipelineSpec is the pods of a pipeline's tasks and finally tasks
// that embed their taskSpec (a taskRef names a Task judged on its own).
func tektonPipelineSpec(spec map[string]any, at string, podTemplate map[string]any, ptAt string) []extract {
	var out []extract
	for _, list := range []string{"tasks", "finally"} {
		for i, t := range listAt(spec, list) {
			tm, ok := t.(map[string]any)
			if !ok {
				continue
			}
			ts := mapAt(tm, "taskSpec")
			if ts == nil {
				continue
			}
			if ex, ok := tektonTask(ts, index(at+"."+list, i)+".taskSpec", podTemplate, ptAt); ok {
				out = append(out, ex)
			}
		}
	}
	return out
}

func tektonPipeline(obj map[string]any) []extract {
	return tektonPipelineSpec(mapAt(obj, "spec"), ".spec", nil, "")
}

func tektonPipelineRun(obj map[string]any) []extract {
	pt, ptAt := mapAt(obj, "spec", "taskRunTemplate", "podTemplate"), ".spec.taskRunTemplate.podTemplate"
	if pt == nil {
		pt, ptAt = mapAt(obj, "spec", "podTemplate"), ".spec.podTemplate" // v1beta1
	}
	return tektonPipelineSpec(mapAt(obj, "spec", "pipelineSpec"), ".spec.pipelineSpec", pt, ptAt)
}

// sparkApplication is the driver's and the executors' pods: a container
// with the role's image (else the application's), env, envVars, envFrom,
// securityContext and volumeMounts, and its gpu as a limit of the GPU
// resource it names; the role's sidecars and init containers; the
// application's volumes and the role's pod fields.
func sparkApplication(at ...string) func(map[string]any) []extract {
	base := ""
	for _, k := range at {
		base += "." + k
	}
	return func(obj map[string]any) []extract {
		spec := mapAt(obj, at...)
		var out []extract
		for _, role := range []string{"driver", "executor"} {
			r := mapAt(spec, role)
			if r == nil {
				continue
			}
			rat := base + "." + role
			c := map[string]any{"name": "spark-kubernetes-" + role}
			var origins []Origin
			if img, ok := r["image"]; ok {
				c["image"] = img
			} else if img, ok := spec["image"]; ok {
				c["image"] = img
			}
			for _, f := range []string{"env", "envFrom", "securityContext", "volumeMounts", "ports", "lifecycle"} {
				if v, ok := r[f]; ok {
					c[f] = v
				}
			}
			if vars := mapAt(r, "envVars"); len(vars) > 0 {
				env, _ := c["env"].([]any)
				keys := make([]string, 0, len(vars))
				for k := range vars {
					keys = append(keys, k)
				}
				slices.Sort(keys)
				for _, k := range keys {
					origins = append(origins, Origin{fmt.Sprintf("template.spec.containers[0].env[%d]", len(env)), trimDot(rat + ".envVars[" + k + "]")})
					env = append(env, map[string]any{"name": k, "value": vars[k]})
				}
				c["env"] = env
			}
			p := newPod()
			p.origins = origins
			if gpu := mapAt(r, "gpu"); gpu != nil {
				if name, ok := gpu["name"].(string); ok && name != "" {
					c["resources"] = map[string]any{"limits": map[string]any{name: gpu["quantity"]}}
					p.origins = append(p.origins, Origin{"template.spec.containers[0].resources", trimDot(rat + ".gpu")})
				}
			}
			p.add("containers", c, rat)
			for j, s := range listAt(r, "sidecars") {
				p.add("containers", s, index(rat+".sidecars", j))
			}
			for j, s := range listAt(r, "initContainers") {
				p.add("initContainers", s, index(rat+".initContainers", j))
			}
			p.set("volumes", spec["volumes"], base+".volumes")
			for pf, rf := range map[string]string{"securityContext": "podSecurityContext", "hostNetwork": "hostNetwork",
				"tolerations": "tolerations", "affinity": "affinity", "serviceAccountName": "serviceAccount",
				"schedulerName": "schedulerName", "dnsConfig": "dnsConfig", "hostAliases": "hostAliases",
				"shareProcessNamespace": "shareProcessNamespace", "terminationGracePeriodSeconds": "terminationGracePeriodSeconds"} {
				p.set(pf, r[rf], rat+"."+rf)
			}
			if ns := merge(spec["nodeSelector"], r["nodeSelector"]); ns != nil {
				p.set("nodeSelector", ns, rat+".nodeSelector")
			}
			md := map[string]any{}
			for _, f := range []string{"labels", "annotations"} {
				if v, ok := r[f]; ok {
					md[f] = v
				}
			}
			if len(md) > 0 {
				p.meta = md
			}
			out = append(out, p.extract(rat))
			if t := mapAt(r, "template"); t != nil {
				out = append(out, extract{path: rat + ".template", template: t, origins: []Origin{{"template", trimDot(rat + ".template")}}})
			}
		}
		return out
	}
}

// KServe component fields beside the pod spec, and the model frameworks,
// each a container with the fields of its model besides.
var (
	kserveExtension = []string{"minReplicas", "maxReplicas", "scaleTarget", "scaleMetric", "scaleMetricType",
		"containerConcurrency", "timeout", "canaryTrafficPercent", "logger", "batcher", "labels", "annotations",
		"deploymentStrategy", "autoScaling", "workerSpec", "storageUris"}
	kserveFrameworks = []string{"model", "sklearn", "xgboost", "tensorflow", "pytorch", "triton", "onnx", "pmml",
		"lightgbm", "paddle", "huggingface", "art", "alibi"}
	kserveModel = []string{"storageUri", "runtimeVersion", "protocolVersion", "modelFormat", "runtime", "storage"}
)

// inferenceService is the pod of each component (predictor, transformer,
// explainer): its model (or framework) as the kserve-container, whose image
// the serving runtime supplies, its containers and its pod spec; and a
// multi-node predictor's workerSpec.
func inferenceService(obj map[string]any) []extract {
	var out []extract
	for _, comp := range []string{"predictor", "transformer", "explainer"} {
		c := mapAt(obj, "spec", comp)
		if c == nil {
			continue
		}
		at := ".spec." + comp
		p := newPod()
		for _, fw := range kserveFrameworks {
			if m := mapAt(c, fw); m != nil {
				p.add("containers", withName(without(m, kserveModel...), "kserve-container"), at+"."+fw)
			}
		}
		for _, key := range []string{"containers", "initContainers"} {
			for i, cc := range listAt(c, key) {
				p.add(key, cc, index(at+"."+key, i))
			}
		}
		rest := without(c, append(append(slices.Clone(kserveExtension), kserveFrameworks...), "containers", "initContainers")...)
		for k, v := range rest {
			p.set(k, v, at+"."+k)
		}
		md := map[string]any{}
		for _, f := range []string{"labels", "annotations"} {
			if v, ok := c[f]; ok {
				md[f] = v
			}
		}
		if len(md) > 0 {
			p.meta = md
		}
		if p.has("containers") {
			out = append(out, p.extract(at))
		}
		if ws := mapAt(c, "workerSpec"); ws != nil {
			w := newPod()
			for k, v := range without(ws, "pipelineParallelSize", "tensorParallelSize") {
				w.set(k, v, at+".workerSpec."+k)
			}
			if w.has("containers") {
				out = append(out, w.extract(at+".workerSpec"))
			}
		}
	}
	return out
}

// trainJob is the pod of a Kubeflow trainer v2 TrainJob's nodes: the
// trainer's image, command, args and env as the node container, with
// resourcesPerNode as its resources, and every podSpecOverrides (or
// podTemplateOverrides) entry merged onto it. A TrainJob whose pods come
// entirely from its runtime has none: the TrainingRuntime is judged.
func trainJob(obj map[string]any) []extract {
	spec := mapAt(obj, "spec")
	p := newPod()
	if tr := mapAt(spec, "trainer"); tr != nil {
		c := map[string]any{"name": "node"}
		for _, f := range []string{"image", "command", "args", "env"} {
			if v, ok := tr[f]; ok {
				c[f] = v
			}
		}
		if r, ok := tr["resourcesPerNode"]; ok {
			c["resources"] = r
			p.origins = append(p.origins, Origin{"template.spec.containers[0].resources", "spec.trainer.resourcesPerNode"})
		}
		p.add("containers", c, ".spec.trainer")
	}
	for i, o := range listAt(spec, "podSpecOverrides") {
		if om, ok := o.(map[string]any); ok {
			p.spec = merge(p.spec, without(om, "targetJobs")).(map[string]any)
			oat := index(".spec.podSpecOverrides", i)
			p.origins = append(p.origins, Origin{"template.spec", trimDot(oat)})
			p.origins = append(p.origins, overrideOrigins(p.spec, om, oat, true)...)
		}
	}
	for i, o := range listAt(spec, "podTemplateOverrides") {
		if om, ok := o.(map[string]any); ok {
			if s := mapAt(om, "spec"); s != nil {
				p.spec = merge(p.spec, s).(map[string]any)
				oat := index(".spec.podTemplateOverrides", i) + ".spec"
				p.origins = append(p.origins, Origin{"template.spec", trimDot(oat)})
				p.origins = append(p.origins, overrideOrigins(p.spec, s, oat, true)...)
			}
			if md := mapAt(om, "metadata"); md != nil {
				m, _ := merge(p.meta, md).(map[string]any)
				p.meta = m
			}
		}
	}
	if !p.has("containers") {
		return nil
	}
	return []extract{p.extract(".spec.trainer")}
}
