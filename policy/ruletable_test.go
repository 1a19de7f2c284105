package policy

import (
	"context"
	"fmt"
	"slices"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpuguard/gpuguard/config"
)

// The rule tables (check_<rule>_test.go) call a rule's function directly,
// on an Input built as the engine builds it, and compare what it returns:
// nothing of the engine's keeping, capping or wording is involved.

// ruleCase is one row of a rule's table.
type ruleCase struct {
	name string
	// policy edits the default policy; nil keeps it.
	policy func(*config.PolicySpec)
	// req is the request; Object is required, the rest defaults to a CREATE
	// in the validating phase.
	req  Request
	want []found
}

// found is a finding as a table states it.
type found struct {
	rule      RuleID
	effect    effect
	container string
	path      string
	message   string
	edit      editKind
}

// inputOf builds the Input the engine would give rules for the request.
func inputOf(t *testing.T, edit func(*config.PolicySpec), req Request) *Input {
	t.Helper()
	e := defaultEngine(t, edit)
	if req.Operation == "" {
		req.Operation = admissionv1.Create
	}
	if req.Phase == "" {
		req.Phase = Validating
	}
	tg, ok := targetOf(req.Object)
	if !ok {
		t.Fatalf("unsupported object %T", req.Object)
	}
	in := e.newInput(context.Background(), &req, tg, &outcome{})
	if !in.plan() {
		t.Fatal("the request puts nothing up for judgement")
	}
	return &in
}

// runRuleTable runs a pod rule (pod set) or a container rule (container
// set, over every container judged) on each case.
func runRuleTable(t *testing.T, cases []ruleCase, pod func(*Input) []Finding, container func(*Input, *containerRef) []Finding) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := inputOf(t, tc.policy, tc.req)
			var fs []Finding
			if pod != nil {
				fs = pod(in)
			} else {
				for i := range in.containers {
					fs = append(fs, container(in, &in.containers[i])...)
				}
			}
			got := foundOf(fs)
			if !slices.Equal(got, tc.want) {
				t.Errorf("findings:\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func foundOf(fs []Finding) []found {
	var out []found
	for i := range fs {
		f := &fs[i]
		g := found{rule: f.rule, effect: f.effect, path: f.Path(), message: f.Message(), edit: f.edit.kind}
		if f.container != nil {
			g.container = f.container.c.Name
		}
		out = append(out, g)
	}
	return out
}

// Fixtures of the tables.

func podOf(containers ...corev1.Container) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}, Spec: corev1.PodSpec{Containers: containers}}
}

func withAnnotations(pod *corev1.Pod, a map[string]string) *corev1.Pod {
	pod.Annotations = a
	return pod
}

func ctr(name string, env ...corev1.EnvVar) corev1.Container {
	return corev1.Container{Name: name, Env: env}
}

func gpuCtr(name string, env ...corev1.EnvVar) corev1.Container {
	c := ctr(name, env...)
	c.Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}
	return c
}

func envVar(name, value string) corev1.EnvVar { return corev1.EnvVar{Name: name, Value: value} }

func withSC(c corev1.Container, sc *corev1.SecurityContext) corev1.Container {
	c.SecurityContext = sc
	return c
}

func ptr[T any](v T) *T { return &v }

// mutating is a CREATE of obj in the mutating phase.
func mutating(obj runtime.Object) Request {
	return Request{Operation: admissionv1.Create, Phase: Mutating, Object: obj}
}

func sprintf(format string, args ...any) string { return fmt.Sprintf(format, args...) }

// hostPathPod is a pod with one host path volume "h" at path, mounted by
// containers (their mounts of "h" added here, read-only where readOnly).
func hostPathPod(path string, readOnly bool, containers ...corev1.Container) *corev1.Pod {
	for i := range containers {
		containers[i].VolumeMounts = append(containers[i].VolumeMounts, corev1.VolumeMount{Name: "h", MountPath: "/h", ReadOnly: readOnly})
	}
	p := podOf(containers...)
	p.Spec.Volumes = []corev1.Volume{{Name: "e"}, {Name: "h", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path}}}}
	return p
}

// hostPathClass runs one class of sensitive-hostpath on the host path
// volume "h" of the request, as checkSensitiveHostPaths would.
func hostPathClass(class func(*Input, hostPathVolume) []Finding) func(*Input) []Finding {
	return func(in *Input) []Finding {
		for i := range in.t.spec.Volumes {
			if v := &in.t.spec.Volumes[i]; v.Name == "h" {
				return class(in, hostPathVolume{volume: v, path: cleanAbsolute(v.HostPath.Path),
					at: in.t.specPath.Child("volumes").Index(i).Child("hostPath", "path").String()})
			}
		}
		return nil
	}
}

// unprivileged is a security context that meets every read-only-parent
// condition but the groups.
func unprivileged() *corev1.SecurityContext {
	return &corev1.SecurityContext{RunAsUser: ptr(int64(1000)), AllowPrivilegeEscalation: ptr(false),
		Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}
}

func ephemeral(name string) corev1.EphemeralContainer {
	return corev1.EphemeralContainer{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: name}}
}
