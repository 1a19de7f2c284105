//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuguard/gpuguard/cel"
	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/e2e/framework"
	"github.com/gpuguard/gpuguard/e2e/framework/controlplane"
)

// webhookKind is what the webhook configurations point at in an arm.
type webhookKind int

const (
	webhookNone webhookKind = iota
	webhookNoop
	webhookPatch
	webhookGPUGuard
	webhookGPUGuardMutating
	// webhookGPUGuardFiltered: gpuguard's webhooks with the pre-filter on the
	// pod webhooks, as the chart's webhook keeps it.
	webhookGPUGuardFiltered
	// webhookGPUGuardFilteredNoInjection: the same with the pre-filter of
	// the policy without injection, as the webhook keeps it while every GPU
	// node is covered (node enforcers or the hardened mark).
	webhookGPUGuardFilteredNoInjection
	// webhookIdle: gpuguard's webhook configurations with a condition on the
	// pod webhooks that only the arrangement's probe meets: what their mere
	// presence costs a pod (for each webhook plugin the API server converts
	// the pod to the webhooks' version and evaluates the condition on it),
	// without gpuguard's pre-filter.
	webhookIdle
)

// celKind is which admission policies an arm installs.
type celKind int

const (
	celNone celKind = iota
	celMinVAP
	celMinMAP
	celMinBoth
	celVAP
	celMAP
	celFull
	celHardened
	// celApplyMAP: gpuguard's MutatingAdmissionPolicy with its injection as an
	// ApplyConfiguration instead of a JSON Patch, to measure the choice.
	celApplyMAP
)

// benchArm is one configuration of the pod-create benchmark.
type benchArm struct {
	name    string
	webhook webhookKind
	cel     celKind
	// voided pods carry void in their plain containers already: gpuguard's
	// VAP alone denies a pod that nothing injected void into.
	voided bool
}

func benchArms() []benchArm {
	return []benchArm{
		{name: "without"},
		{name: "min-vap", cel: celMinVAP},
		{name: "min-map", cel: celMinMAP},
		{name: "min-map+min-vap", cel: celMinBoth},
		{name: "min-map+min-vap+idle-webhooks", webhook: webhookIdle, cel: celMinBoth},
		{name: "noop-webhook", webhook: webhookNoop},
		{name: "patch-webhook", webhook: webhookPatch},
		{name: "cel-vap", cel: celVAP, voided: true},
		{name: "cel-map", cel: celMAP},
		{name: "cel", cel: celFull},
		{name: "webhook", webhook: webhookGPUGuard},
		{name: "inject-webhook", webhook: webhookGPUGuardMutating},
		{name: "inject-webhook+cel-vap", webhook: webhookGPUGuardMutating, cel: celVAP},
		{name: "cel-map-apply", cel: celApplyMAP},
		{name: "default", webhook: webhookGPUGuardFiltered, cel: celFull},
		{name: "default-unfiltered", webhook: webhookGPUGuard, cel: celFull},
		{name: "hardened", cel: celHardened},
		{name: "hardened+idle-webhooks", webhook: webhookIdle, cel: celHardened},
		{name: "node-enforced", webhook: webhookGPUGuardFilteredNoInjection, cel: celHardened},
	}
}

// armsNamed are the arms of benchArms with these names, in this order.
func armsNamed(tb testing.TB, names ...string) []benchArm {
	all := benchArms()
	var arms []benchArm
	for _, n := range names {
		i := slices.IndexFunc(all, func(a benchArm) bool { return a.name == n })
		if i < 0 {
			tb.Fatalf("no benchmark arm %q", n)
		}
		arms = append(arms, all[i])
	}
	return arms
}

// benchBackends are the reference webhooks and the admission policies the
// arms use.
type benchBackends struct {
	noop, patch *referenceWebhook
	full        *cel.Policies // gpuguard's backstop, as the chart installs it
	minimal     *cel.Policies // one short validation and one short patch
	hardened    *cel.Policies // gpuguard's, from a policy without injection
	applyMAP    *cel.Policies // gpuguard's, injecting by ApplyConfiguration
	filtered    *controlplane.WebhookConfigurations
	// covered: the webhooks as they are while every GPU node is covered.
	covered *controlplane.WebhookConfigurations
	idle    *controlplane.WebhookConfigurations
}

func newBenchBackends(b *testing.B) *benchBackends {
	opts := cel.Options{ExcludedNamespaces: []string{releaseNS, excludedNS, selfManagedNS, chartNamespace}}
	full, err := cel.Render(config.Default(), opts)
	if err != nil {
		b.Fatal(err)
	}
	noInjection := config.Default()
	noInjection.Spec.InjectVoid = false
	hardened, err := cel.Render(noInjection, opts)
	if err != nil {
		b.Fatal(err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: benchAllGPUs}, Data: map[string]string{"NVIDIA_VISIBLE_DEVICES": "all"}}
	if _, err := s.cp.Client.CoreV1().ConfigMaps(enforceNS).Create(context.Background(), cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		b.Fatal(err)
	}
	return &benchBackends{noop: startReferenceWebhook(b, false), patch: startReferenceWebhook(b, true),
		full: full, hardened: hardened, minimal: minimalPolicies(full), applyMAP: applyConfigurationPolicies(full),
		filtered: filteredConfigs(b, config.Default()), covered: filteredConfigs(b, noInjection), idle: conditionedConfigs(idleCondition, idleCondition)}
}

// renamedCopy is a copy of the policies and bindings under another name.
func renamedCopy(full *cel.Policies, name string) *cel.Policies {
	m := &cel.Policies{Validating: full.Validating.DeepCopy(), ValidatingBinding: full.ValidatingBinding.DeepCopy(),
		Mutating: full.Mutating.DeepCopy(), MutatingBinding: full.MutatingBinding.DeepCopy()}
	m.Validating.Name, m.ValidatingBinding.Name, m.ValidatingBinding.Spec.PolicyName = name, name, name
	m.Mutating.Name, m.MutatingBinding.Name, m.MutatingBinding.Spec.PolicyName = name, name, name
	return m
}

// minimalPolicies are the smallest policies of gpuguard's shape: its match
// rules and bindings, one validation and one JSON Patch, no variables.
func minimalPolicies(full *cel.Policies) *cel.Policies {
	m := renamedCopy(full, "bench-minimal")
	m.Validating.Spec.Variables, m.Validating.Spec.MatchConditions = nil, nil
	m.Validating.Spec.Validations = []admissionregistrationv1.Validation{{
		Expression: "object.spec.containers.all(c, !has(c.env) || c.env.all(e, e.name != 'NVIDIA_VISIBLE_DEVICES' || e.value == 'void'))",
		Message:    "minimal policy",
	}}
	m.Mutating.Spec.Variables, m.Mutating.Spec.MatchConditions = nil, nil
	m.Mutating.Spec.Mutations = []admissionregistrationv1.Mutation{{
		PatchType: admissionregistrationv1.PatchTypeJSONPatch,
		JSONPatch: &admissionregistrationv1.JSONPatch{Expression: `[JSONPatch{op: "add", path: "/spec/containers/0/env", ` +
			`value: [Object.spec.containers.env{name: "NVIDIA_VISIBLE_DEVICES", value: "void"}]}]`},
	}}
	return m
}

// applyConfigurationPolicies are gpuguard's policies with the injection as
// an ApplyConfiguration: each container that needs it gets its device
// variable merged to void by name (replacing a value rather than appending
// after it, which an ApplyConfiguration cannot do).
func applyConfigurationPolicies(full *cel.Policies) *cel.Policies {
	m := renamedCopy(full, "bench-apply")
	gpu := `has(c.resources) && has(c.resources.limits) && c.resources.limits.exists(k, k.startsWith("nvidia.com/"))`
	notVoid := `!(has(c.env) && c.env.exists(e, e.name == "NVIDIA_VISIBLE_DEVICES" && has(e.value) && e.value == "void"))`
	var fields []string
	for _, l := range []string{"initContainers", "containers"} {
		fields = append(fields, fmt.Sprintf(`?%[1]s: optional.ofNonZeroValue((has(object.spec.%[1]s) ? object.spec.%[1]s : []).filter(c, !(%[2]s) && %[3]s)`+
			`.map(c, Object.spec.%[1]s{name: c.name, env: [Object.spec.%[1]s.env{name: "NVIDIA_VISIBLE_DEVICES", value: "void"}]}))`, l, gpu, notVoid))
	}
	m.Mutating.Spec.Mutations = []admissionregistrationv1.Mutation{{
		PatchType:          admissionregistrationv1.PatchTypeApplyConfiguration,
		ApplyConfiguration: &admissionregistrationv1.ApplyConfiguration{Expression: "Object{spec: Object.spec{" + strings.Join(fields, ", ") + "}}"},
	}}
	return m
}

// arrange removes every policy and webhook configuration, waits until the
// API server no longer acts on them, installs the arm's, and waits until the
// API server acts on those. Without the first wait, the previous arm's
// policies could pass for the new arm's and leave in the middle of a batch.
func (bb *benchBackends) arrange(ctx context.Context, a benchArm) error {
	if err := s.Configs.Remove(ctx, s.cp.Client); err != nil {
		return err
	}
	for _, p := range []*cel.Policies{bb.full, bb.minimal, bb.applyMAP} {
		if err := removePolicies(ctx, p); err != nil {
			return err
		}
	}
	if err := bb.waitNothingActs(ctx); err != nil {
		return fmt.Errorf("the API server still acts on the previous arm's admission: %w", err)
	}
	validating, mutating := bb.policiesOf(a.cel)
	if err := installPolicies(ctx, validating, mutating); err != nil {
		return err
	}
	// gpuguard's injecting policy's VAP alone denies a plain pod (nothing
	// injected its void); the minimal and hardened ones do not. Without
	// policies, waitNothingActs has seen to it already.
	voidRequired := validating == bb.full && mutating == nil
	if validating != nil || mutating != nil {
		if err := waitPolicies(ctx, validating != nil, mutating != nil, voidRequired); err != nil {
			return fmt.Errorf("the API server does not act on the arm's policies: %w", err)
		}
	}
	return bb.installWebhooks(ctx, a.webhook)
}

// policiesOf picks the policies of a kind: validating, mutating, or nil.
func (bb *benchBackends) policiesOf(k celKind) (validating, mutating *cel.Policies) {
	switch k {
	case celMinVAP:
		return bb.minimal, nil
	case celMinMAP:
		return nil, bb.minimal
	case celMinBoth:
		return bb.minimal, bb.minimal
	case celVAP:
		return bb.full, nil
	case celMAP:
		return nil, bb.full
	case celFull:
		return bb.full, bb.full
	case celHardened:
		return bb.hardened, nil
	case celApplyMAP:
		return nil, bb.applyMAP
	}
	return nil, nil
}

func (bb *benchBackends) installWebhooks(ctx context.Context, k webhookKind) error {
	pods := s.cp.Client.CoreV1().Pods(enforceNS)
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	switch k {
	case webhookNone:
		return nil
	case webhookNoop, webhookPatch:
		ref := bb.noop
		if k == webhookPatch {
			ref = bb.patch
		}
		s.Configs.PointAt(ref.port, s.CA.PEM)
		install := s.Configs.Install
		if k == webhookPatch {
			install = s.Configs.InstallMutating
		}
		if err := install(ctx, s.cp.Client); err != nil {
			return err
		}
		seen, err := ref.calls()
		if err != nil {
			return err
		}
		return framework.Poll(ctx, time.Minute, func() (bool, error) {
			_, _ = pods.Create(ctx, plainPod("probe"), dry)
			calls, err := ref.calls()
			return calls > seen, err
		})
	}
	s.Configs.PointAt(s.Webhook.Port, s.CA.PEM)
	install := s.Configs.Install
	switch k {
	case webhookGPUGuardMutating:
		install = s.Configs.InstallMutating
	case webhookGPUGuardFiltered:
		install = bb.filtered.Install
	case webhookGPUGuardFilteredNoInjection:
		install = bb.covered.Install
	case webhookIdle:
		install = bb.idle.Install
	}
	if err := install(ctx, s.cp.Client); err != nil {
		return err
	}
	if k == webhookGPUGuardFiltered || k == webhookGPUGuardFilteredNoInjection || k == webhookIdle {
		// Ordinary pods no longer reach the webhooks: wait for the
		// webhook's own denial of a violating one. The idle condition
		// holds for the probe alone, which the mutating webhook denies by
		// an annotation (the minimal MAP's patch of env leaves it in
		// place). Behind the pre-filter, the probe is one only the
		// webhooks judge, which gpuguard's VAP cannot deny first: a GPU
		// container pouring in a ConfigMap that asks for every GPU.
		probe := plainPod(idleProbe)
		probe.Annotations = map[string]string{"cdi.k8s.io/gpus": "nvidia.com/gpu=all"}
		if k != webhookIdle {
			probe.Annotations = nil
			probe.Spec.Containers = []corev1.Container{gpuContainer("train")}
			probe.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: benchAllGPUs}}}}
		}
		return framework.Poll(ctx, time.Minute, func() (bool, error) {
			_, err := pods.Create(ctx, probe, dry)
			return err != nil && strings.Contains(err.Error(), "gpuguard denied"), nil
		})
	}
	return s.waitEnforcing(ctx)
}

// filteredConfigs are the suite's webhook configurations with the
// pre-filter of policy p on the pod webhooks, as the webhook keeps it.
func filteredConfigs(tb testing.TB, p *config.Policy) *controlplane.WebhookConfigurations {
	expr, err := cel.Prefilter(p)
	if err != nil {
		tb.Fatal(err)
	}
	cond := admissionregistrationv1.MatchCondition{Name: cel.PrefilterName, Expression: expr}
	return conditionedConfigs(cond, cond)
}

// benchAllGPUs names the ConfigMap, asking for every GPU, that the probe of
// the pre-filtered arms pours into its GPU container.
const benchAllGPUs = "bench-all-gpus"

// idleProbe names the pod by which arrange sees the webhooks in place; the
// idle condition holds for it alone.
const idleProbe = "gpuguard-idle-probe"

var idleCondition = admissionregistrationv1.MatchCondition{Name: "idle", Expression: `object.metadata.name == "` + idleProbe + `"`}

// conditionedConfigs are the suite's webhook configurations with a match
// condition on each pod webhook.
func conditionedConfigs(mutating, validating admissionregistrationv1.MatchCondition) *controlplane.WebhookConfigurations {
	s.Configs.PointAt(s.Webhook.Port, s.CA.PEM)
	f := &controlplane.WebhookConfigurations{Mutating: s.Configs.Mutating.DeepCopy(), Validating: s.Configs.Validating.DeepCopy()}
	for i := range f.Mutating.Webhooks {
		if w := &f.Mutating.Webhooks[i]; w.Name == prefilteredWebhooks[0] {
			w.MatchConditions = append(w.MatchConditions, mutating)
		}
	}
	for i := range f.Validating.Webhooks {
		if w := &f.Validating.Webhooks[i]; w.Name == prefilteredWebhooks[1] {
			w.MatchConditions = append(w.MatchConditions, validating)
		}
	}
	return f
}

// restore puts the suite back: gpuguard's webhooks, no admission policies.
func (bb *benchBackends) restore(b *testing.B) {
	if err := bb.arrange(context.Background(), benchArm{name: "restore", webhook: webhookGPUGuard}); err != nil {
		b.Fatal(err)
	}
}

func installPolicies(ctx context.Context, validating, mutating *cel.Policies) error {
	ar := s.cp.Client.AdmissionregistrationV1()
	if validating != nil {
		if _, err := ar.ValidatingAdmissionPolicies().Create(ctx, validating.Validating, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("ValidatingAdmissionPolicy %s: %w", validating.Validating.Name, err)
		}
		if _, err := ar.ValidatingAdmissionPolicyBindings().Create(ctx, validating.ValidatingBinding, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	if mutating != nil {
		if _, err := ar.MutatingAdmissionPolicies().Create(ctx, mutating.Mutating, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("MutatingAdmissionPolicy %s: %w", mutating.Mutating.Name, err)
		}
		if _, err := ar.MutatingAdmissionPolicyBindings().Create(ctx, mutating.MutatingBinding, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

func removePolicies(ctx context.Context, p *cel.Policies) error {
	ar := s.cp.Client.AdmissionregistrationV1()
	var errs []error
	for _, del := range []func() error{
		func() error {
			return ar.ValidatingAdmissionPolicyBindings().Delete(ctx, p.ValidatingBinding.Name, metav1.DeleteOptions{})
		},
		func() error {
			return ar.ValidatingAdmissionPolicies().Delete(ctx, p.Validating.Name, metav1.DeleteOptions{})
		},
		func() error {
			return ar.MutatingAdmissionPolicyBindings().Delete(ctx, p.MutatingBinding.Name, metav1.DeleteOptions{})
		},
		func() error {
			return ar.MutatingAdmissionPolicies().Delete(ctx, p.Mutating.Name, metav1.DeleteOptions{})
		},
	} {
		if err := del(); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// referenceCalls counts the reviews the reference webhooks have answered.
func (bb *benchBackends) referenceCalls() (int64, error) {
	noop, err := bb.noop.calls()
	if err != nil {
		return 0, err
	}
	patch, err := bb.patch.calls()
	return noop + patch, err
}

// leakingPod is a plain pod with a second container that asks for every GPU.
func leakingPod() *corev1.Pod {
	leak := plainPod("bench-leak")
	leak.Spec.Containers = append(leak.Spec.Containers, corev1.Container{Name: "leak", Image: "busybox", Env: []corev1.EnvVar{allGPUs}})
	return leak
}

// waitNothingActs waits until a pod with a leaking container is admitted
// untouched, and the reference webhooks are no longer called.
func (bb *benchBackends) waitNothingActs(ctx context.Context) error {
	pods, dry, leak := s.cp.Client.CoreV1().Pods(enforceNS), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}, leakingPod()
	var seen string
	err := framework.Poll(ctx, 2*time.Minute, func() (bool, error) {
		before, err := bb.referenceCalls()
		if err != nil {
			return false, err
		}
		p, err := pods.Create(ctx, leak, dry)
		if err != nil {
			seen = err.Error()
			return false, nil
		}
		seen = fmt.Sprintf("env %v", p.Spec.Containers[0].Env)
		after, err := bb.referenceCalls()
		return len(p.Spec.Containers[0].Env) == 0 && after == before, err
	})
	if err != nil {
		return fmt.Errorf("%w; last seen %s", err, seen)
	}
	return nil
}

// waitPolicies waits until the API server acts on exactly the policies
// installed: a pod with a leaking second container is denied when a
// validating policy is there; a plain pod gets void on its first container
// when a mutating one is, and otherwise is stored untouched or, under
// gpuguard's own VAP with nothing to inject, denied for the missing void.
func waitPolicies(ctx context.Context, validating, mutating, voidRequired bool) error {
	pods, dry, leak := s.cp.Client.CoreV1().Pods(enforceNS), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}, leakingPod()
	var seen string
	err := framework.Poll(ctx, 2*time.Minute, func() (bool, error) {
		_, leakErr := pods.Create(ctx, leak, dry)
		p, err := pods.Create(ctx, plainPod("bench-probe"), dry)
		seen = fmt.Sprintf("leak: %v; plain: %v", leakErr, err)
		if err == nil {
			seen += fmt.Sprintf(" (env %v)", p.Spec.Containers[0].Env)
		}
		if denied := leakErr != nil; denied != validating {
			return false, nil
		}
		switch {
		case mutating:
			return err == nil && lastEnv(p.Spec.Containers[0], "NVIDIA_VISIBLE_DEVICES") == "void", nil
		case voidRequired:
			return err != nil && strings.Contains(err.Error(), "[final-state]"), nil
		}
		return err == nil && lastEnv(p.Spec.Containers[0], "NVIDIA_VISIBLE_DEVICES") != "void", nil
	})
	if err != nil {
		return fmt.Errorf("%w; want validating=%v mutating=%v voidRequired=%v, last seen %s", err, validating, mutating, voidRequired, seen)
	}
	return nil
}

// referenceWebhook is a webhook process that decodes every review and
// allows it; the patch one returns gpuguard's void patch for every container
// without looking at the policy: the least a webhook that injects can cost.
// It is a process of its own, as gpuguard's webhook is, so that the two
// differ only in what they do with a review: served from the benchmark's
// own process, it shared the client's runtime and threads, which no
// deployed webhook does.
type referenceWebhook struct {
	port   int
	client *http.Client
}

// referenceWebhookEnv, in the environment of this test binary, makes it serve
// a reference webhook instead of running the suite (see TestMain): noop or
// patch, with the serving certificate in referenceCertDirEnv. It prints its
// port on its first line, and exits when its standard input closes.
const referenceWebhookEnv, referenceCertDirEnv = "GPUGUARD_E2E_REFERENCE_WEBHOOK", "GPUGUARD_E2E_REFERENCE_CERT_DIR"

// callsPath answers how many reviews the reference webhook has answered.
const callsPath = "/calls"

func startReferenceWebhook(b *testing.B, patch bool) *referenceWebhook {
	kind := "noop"
	if patch {
		kind = "patch"
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), referenceWebhookEnv+"="+kind, referenceCertDirEnv+"="+s.CertDir)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = stdin.Close(); _ = cmd.Wait() })
	var port int
	if _, err := fmt.Fscanln(stdout, &port); err != nil {
		b.Fatalf("reference webhook %s: no port: %v", kind, err)
	}
	return &referenceWebhook{port: port, client: &http.Client{Timeout: 10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: s.CA.Pool(), ServerName: "localhost"}}}}
}

// calls is how many reviews the reference webhook has answered.
func (n *referenceWebhook) calls() (int64, error) {
	resp, err := n.client.Get(fmt.Sprintf("https://127.0.0.1:%d%s", n.port, callsPath))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var calls int64
	if _, err := fmt.Fscan(resp.Body, &calls); err != nil {
		return 0, fmt.Errorf("reference webhook: reading its count: %w", err)
	}
	return calls, nil
}

// serveReferenceWebhook is the reference webhook process's main.
func serveReferenceWebhook(kind string) int {
	dir := os.Getenv(referenceCertDirEnv)
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "reference webhook:", err)
		return 1
	}
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "reference webhook:", err)
		return 1
	}
	var calls atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc(callsPath, func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, calls.Load()) })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		answerReview(w, r, kind == "patch")
	})
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: mux}
	go func() { _ = srv.Serve(l) }()
	fmt.Println(l.Addr().(*net.TCPAddr).Port)
	_, _ = io.Copy(io.Discard, os.Stdin)
	_ = srv.Close()
	return 0
}

func answerReview(w http.ResponseWriter, r *http.Request, patch bool) {
	var review admissionv1.AdmissionReview
	if err := json.NewDecoder(r.Body).Decode(&review); err != nil || review.Request == nil {
		http.Error(w, "bad review", http.StatusBadRequest)
		return
	}
	resp := &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: true}
	if patch && review.Request.Kind.Kind == "Pod" {
		var pod corev1.Pod
		if err := json.Unmarshal(review.Request.Object.Raw, &pod); err == nil {
			if ops := voidPatch(&pod); len(ops) > 2 {
				pt := admissionv1.PatchTypeJSONPatch
				resp.Patch, resp.PatchType = ops, &pt
			}
		}
	}
	review.Response, review.Request = resp, nil
	_ = json.NewEncoder(w).Encode(&review)
}

// voidPatch adds NVIDIA_VISIBLE_DEVICES=void to every container without a
// GPU limit, as gpuguard's mutation does for a plain pod.
func voidPatch(pod *corev1.Pod) []byte {
	var ops []string
	void := `{"name":"NVIDIA_VISIBLE_DEVICES","value":"void"}`
	add := func(list string, cs []corev1.Container) {
		for i, c := range cs {
			if _, gpu := c.Resources.Limits["nvidia.com/gpu"]; gpu {
				continue
			}
			if len(c.Env) == 0 {
				ops = append(ops, fmt.Sprintf(`{"op":"add","path":"/spec/%s/%d/env","value":[%s]}`, list, i, void))
			} else {
				ops = append(ops, fmt.Sprintf(`{"op":"add","path":"/spec/%s/%d/env/-","value":%s}`, list, i, void))
			}
		}
	}
	add("initContainers", pod.Spec.InitContainers)
	add("containers", pod.Spec.Containers)
	return []byte("[" + strings.Join(ops, ",") + "]")
}
