//go:build e2e

package cluster

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/gpuguard/gpuguard/e2e/framework"
	"github.com/gpuguard/gpuguard/e2e/framework/controlplane"
	"github.com/gpuguard/gpuguard/e2e/framework/kubenode"
	"github.com/gpuguard/gpuguard/internal/wellknown"
)

// outcome judges one command's output and error; it says what is wrong, or "".
type outcome func(out string, err error) string

// step is a walkthrough block of the README (marked
// `<!-- walkthrough: NAME -->`), one outcome per command, and what must hold
// in the cluster afterwards.
type step struct {
	block string
	want  []outcome
	after func(t *testing.T)
	// publish: the block builds and pushes from the repository (make
	// images, make push), with the machine's Go environment, to the
	// cluster's registry in place of the README's registry.example.com.
	publish bool
}

// readmeRegistry is the registry the README names, and the path in the
// cluster's registry that stands for it.
const (
	readmeRegistry = "registry.example.com/platform"
	readmePath     = "platform"
)

// readmeRelease is what the README's publish block pushed: the rest of the
// walkthrough installs it.
var readmeRelease kubenode.Published

// walkthrough is the README's Install section as a newcomer
// follows it. A changed number of commands fails the test: a README edit
// must come with its expected outcome here.
var walkthrough = []step{
	// Both platforms' images and the chart, built and pushed as a release is.
	{block: "publish", publish: true, want: []outcome{outputMatches(`/gpuguard-agent@sha256:[0-9a-f]{64}`), succeeds},
		after: pushedImages},
	// In warn mode; its helm test expects a warning.
	{block: "install", want: []outcome{succeeds, succeeds, succeeds, succeeds, outputMatches(`Phase:\s+Succeeded`)},
		after: func(t *testing.T) {
			webhookServedFromPods(t)
			imagesPulledByDigest(t)
			servingPodsWriteNothing(t)
			pullSecretHoldsOneRegistry(t)
		}},
	// The would-be denial, admitted with its warning; void in every mode.
	{block: "see-it-work", want: []outcome{succeeds, warnedBy("device-env"),
		outputMatches(`"name":"NVIDIA_VISIBLE_DEVICES","value":"void"`)}},
	// The candidate policy judges what runs: the warned pod would be denied.
	{block: "preview", want: []outcome{succeeds, failsWith(`DENY\s+Pod gpuguard-demo/miner`)}},
	{block: "enforce", want: []outcome{succeeds, outputMatches(`PASS: gpuguard denied`), deniedBy("device-env")},
		after: webhookServedFromPods},
	{block: "typo", want: []outcome{failsWith(`additional properties 'injectVoidd' not allowed`)}, after: webhookServedFromPods},
	{block: "uninstall", want: []outcome{succeeds, succeeds, succeeds}, after: nothingLeftBehind},
}

// TestREADMEWalkthrough runs the README's Helm commands verbatim, with the
// real helm and kubectl, on a cluster that has nothing of gpuguard but its
// image: from `helm install` to a denied violating pod, and back out.
func TestREADMEWalkthrough(t *testing.T) {
	// Without gpuguard, the violating pod is admitted: the denial below is
	// gpuguard's doing.
	if _, err := dryRunViolatingPod(t, metav1.NamespaceDefault); err != nil {
		t.Fatalf("before install, the violating pod should be admitted: %v", err)
	}
	blocks, err := readmeBlocks(filepath.Join(s.root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for name := range blocks {
		if !slices.ContainsFunc(walkthrough, func(st step) bool { return st.block == name }) {
			t.Fatalf("README block %q is marked as run by e2e/cluster, which has no step for it: add it to walkthrough", name)
		}
	}
	sh := newShell(t)
	// A walkthrough that fails midway leaves the release behind; the next
	// test needs a cluster without it.
	t.Cleanup(func() {
		if t.Failed() {
			_, _ = sh.run("helm uninstall gpuguard -n gpuguard --wait")
		}
	})
	for _, st := range walkthrough {
		cmds, ok := blocks[st.block]
		if !ok {
			t.Fatalf("README has no block marked <!-- walkthrough: %s -->", st.block)
		}
		if len(cmds) != len(st.want) {
			t.Fatalf("README block %q has %d commands, the test expects %d: update walkthrough in %s\n%s",
				st.block, len(cmds), len(st.want), "e2e/cluster/walkthrough_test.go", strings.Join(cmds, "\n"))
		}
		for i, cmd := range cmds {
			start := time.Now()
			var out string
			var err error
			if st.publish {
				out, err = sh.publish(cmd)
			} else {
				out, err = sh.run(cmd)
			}
			if msg := st.want[i](out, err); msg != "" {
				t.Fatalf("README %s: `%s`: %s\noutput:\n%s\n%s", st.block, cmd, msg, out, s.node.LogTails())
			}
			t.Logf("README %s: `%s`: ok (%s)", st.block, cmd, time.Since(start).Round(time.Second))
		}
		if st.after != nil {
			start := time.Now()
			st.after(t)
			t.Logf("README %s: checked in %s", st.block, time.Since(start).Round(time.Second))
		}
	}
}

func succeeds(out string, err error) string {
	if err != nil {
		return fmt.Sprintf("failed: %v", err)
	}
	return ""
}

func outputMatches(pattern string) outcome {
	re := regexp.MustCompile(pattern)
	return func(out string, err error) string {
		if err != nil {
			return fmt.Sprintf("failed: %v", err)
		}
		if !re.MatchString(out) {
			return fmt.Sprintf("output does not match %q", pattern)
		}
		return ""
	}
}

// failsWith wants the command to fail with output matching pattern.
func failsWith(pattern string) outcome {
	re := regexp.MustCompile(pattern)
	return func(out string, err error) string {
		if err == nil {
			return "succeeded; it should have failed"
		}
		if !re.MatchString(out) {
			return fmt.Sprintf("failed, but its output does not match %q", pattern)
		}
		return ""
	}
}

// deniedBy wants the command refused by gpuguard's webhook, naming rule.
// servingPodsWriteNothing asks the API server's authorizer what the chart's
// accounts may do: the serving pods' account may not write gpuguard's webhook
// configurations, its CEL backstop or its serving certificate's Secret; the
// controller's may (else nothing would keep them, and the check would prove
// nothing).
func servingPodsWriteNothing(t *testing.T) {
	ctx := context.Background()
	can := func(sa string, a authorizationv1.ResourceAttributes) bool {
		review, err := s.cp.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{User: "system:serviceaccount:gpuguard:" + sa,
				Groups: []string{"system:serviceaccounts", "system:serviceaccounts:gpuguard"}, ResourceAttributes: &a}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return review.Status.Allowed
	}
	writes := []authorizationv1.ResourceAttributes{
		{Group: "admissionregistration.k8s.io", Resource: "validatingwebhookconfigurations", Name: "gpuguard", Verb: "patch"},
		{Group: "admissionregistration.k8s.io", Resource: "mutatingwebhookconfigurations", Name: "gpuguard", Verb: "update"},
		{Group: "admissionregistration.k8s.io", Resource: "validatingadmissionpolicies", Name: "gpuguard-backstop", Verb: "patch"},
		{Group: "admissionregistration.k8s.io", Resource: "mutatingadmissionpolicies", Name: "gpuguard-backstop", Verb: "patch"},
		{Resource: "secrets", Namespace: "gpuguard", Name: "gpuguard-webhook-tls", Verb: "update"},
	}
	for _, w := range writes {
		if can("gpuguard-webhook", w) {
			t.Errorf("the serving pods' account may %s %s/%s", w.Verb, w.Resource, w.Name)
		}
		if !can("gpuguard-controller", w) {
			t.Errorf("the controller's account may not %s %s/%s: nothing keeps it", w.Verb, w.Resource, w.Name)
		}
	}
}

// warnedBy wants the command to succeed with a gpuguard warning naming rule.
func warnedBy(rule string) outcome {
	return func(out string, err error) string {
		if err != nil {
			return fmt.Sprintf("failed: %v; gpuguard should only have warned in warn mode", err)
		}
		if !strings.Contains(out, "Warning: gpuguard "+rule+":") {
			return fmt.Sprintf("admitted, but without a gpuguard warning naming rule %s", rule)
		}
		return ""
	}
}

func deniedBy(rule string) outcome {
	return func(out string, err error) string {
		if err == nil {
			return "succeeded; gpuguard should have denied it"
		}
		if !strings.Contains(out, "denied the request") || !strings.Contains(out, rule) {
			return fmt.Sprintf("failed, but not with a gpuguard denial naming rule %s", rule)
		}
		return ""
	}
}

// webhookServedFromPods checks that the webhook runs as the chart's pods on
// the pod network: its Service's endpoints are pod addresses.
func webhookServedFromPods(t *testing.T) {
	ctx := context.Background()
	_, pods, _ := net.ParseCIDR(s.cp.Network.PodCIDR)
	slices, err := s.cp.Client.DiscoveryV1().EndpointSlices("gpuguard").List(ctx, metav1.ListOptions{
		LabelSelector: "kubernetes.io/service-name=gpuguard-webhook"})
	if err != nil {
		t.Fatal(err)
	}
	var ready int
	for _, sl := range slices.Items {
		for _, ep := range sl.Endpoints {
			if ep.Conditions.Ready != nil && *ep.Conditions.Ready && len(ep.Addresses) > 0 && pods.Contains(net.ParseIP(ep.Addresses[0])) {
				ready++
			}
		}
	}
	if ready < 2 {
		t.Fatalf("want at least 2 ready webhook endpoints on the pod network %s, got %d: %+v", pods, ready, slices.Items)
	}
}

// imagesPulledByDigest checks that the release runs exactly what was
// pushed: every container of gpuguard's workloads names its image by the
// digest the registry holds, and the webhook's pods were pulled from there.
func imagesPulledByDigest(t *testing.T) {
	ctx := context.Background()
	want := map[string]string{"webhook": readmeRelease.GPUGuard, "agent": readmeRelease.Agent}
	deploy, err := s.cp.Client.AppsV1().Deployments("gpuguard").Get(ctx, "gpuguard-webhook", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ds, err := s.cp.Client.AppsV1().DaemonSets("gpuguard").Get(ctx, "gpuguard-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for component, spec := range map[string]corev1.PodSpec{"webhook": deploy.Spec.Template.Spec, "agent": ds.Spec.Template.Spec} {
		for _, c := range spec.Containers {
			if c.Image != want[component] {
				t.Errorf("%s container %s runs %s, want the pushed %s", component, c.Name, c.Image, want[component])
			}
		}
	}
	pods, err := s.cp.Client.CoreV1().Pods("gpuguard").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=webhook"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		for _, st := range p.Status.ContainerStatuses {
			if !strings.HasPrefix(st.ImageID, readmeRelease.Registry+"/gpuguard@sha256:") {
				t.Errorf("pod %s container %s: image ID %q is not from the registry %s", p.Name, st.Name, st.ImageID, readmeRelease.Registry)
			}
		}
	}
}

// nothingLeftBlocking checks that `helm uninstall` leaves no webhook
// configuration behind, and that the garbage collector removes the CEL
// backstop the webhook made (owned by the webhook's ClusterRole): nothing
// of gpuguard judges pods any more.
func nothingLeftBlocking(t *testing.T) {
	ctx := context.Background()
	// The webhook configurations, which the webhook registered, go with
	// its ClusterRole, as the backstop does: the garbage collector's work.
	var left []string
	err := framework.Poll(ctx, 2*time.Minute, func() (bool, error) {
		left = append(webhookConfigurations(ctx, t), admissionPolicies(ctx, t)...)
		return len(left) == 0, nil
	})
	if err != nil {
		t.Fatalf("after helm uninstall, the garbage collector left %v", left)
	}
	waitUnguarded(t, metav1.NamespaceDefault)
}

// nothingLeftBehind: besides nothing left blocking pods, nothing gpuguard
// wrote at run time is left after `gpuguard cleanup`: no Report or
// ClusterReport of its own, none of its node labels, none of its Leases.
func nothingLeftBehind(t *testing.T) {
	nothingLeftBlocking(t)
	ctx := context.Background()
	dyn, err := dynamic.NewForConfig(s.cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, r := range []string{"reports", "clusterreports"} {
		list, err := dyn.Resource(schema.GroupVersionResource{Group: "openreports.io", Version: "v1alpha1", Resource: r}).
			List(ctx, metav1.ListOptions{LabelSelector: wellknown.ManagedByLabel + "=" + wellknown.ManagedBy})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		for _, item := range list.Items {
			left = append(left, r+" "+item.GetNamespace()+"/"+item.GetName())
		}
	}
	nodes, err := s.cp.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		for k := range n.Labels {
			if strings.HasPrefix(k, wellknown.Domain+"/") || k == wellknown.HardenedMarkLabel {
				left = append(left, "label "+k+" on node "+n.Name)
			}
		}
	}
	leases, err := s.cp.Client.CoordinationV1().Leases("gpuguard").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leases.Items {
		if strings.HasPrefix(l.Name, "gpuguard") {
			left = append(left, "Lease gpuguard/"+l.Name)
		}
	}
	if len(left) > 0 {
		t.Fatalf("after helm uninstall and gpuguard cleanup, gpuguard's objects are left: %v", left)
	}
}

// waitUnguarded waits until pods in ns are neither judged nor changed by
// gpuguard: the API server's admission policy plugins act on deleted
// policies until their caches catch up, which takes a moment.
func waitUnguarded(t *testing.T, ns string) {
	var admitted *corev1.Pod
	var lastErr error
	err := framework.Poll(context.Background(), time.Minute, func() (bool, error) {
		admitted, lastErr = dryRunViolatingPod(t, ns)
		return lastErr == nil && len(admitted.Spec.Containers[0].Env) == 1, nil
	})
	if err != nil {
		t.Fatalf("pods in %s are still judged or changed by gpuguard: %v, admitted as %+v", ns, lastErr, admitted)
	}
}

// webhookConfigurations names every webhook configuration in the cluster
// (gpuguard's are the only ones this cluster ever has).
func webhookConfigurations(ctx context.Context, t *testing.T) []string {
	reg := s.cp.Client.AdmissionregistrationV1()
	var names []string
	vwcs, err := reg.ValidatingWebhookConfigurations().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range vwcs.Items {
		names = append(names, "ValidatingWebhookConfiguration/"+w.Name)
	}
	mwcs, err := reg.MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range mwcs.Items {
		names = append(names, "MutatingWebhookConfiguration/"+w.Name)
	}
	return names
}

// admissionPolicies names every admission policy and binding in the cluster
// (gpuguard's CEL backstop is the only one this cluster ever has).
func admissionPolicies(ctx context.Context, t *testing.T) []string {
	reg := s.cp.Client.AdmissionregistrationV1()
	var names []string
	add := func(kind string, n int, err error, name func(int) string) {
		if err != nil {
			t.Fatal(err)
		}
		for i := range n {
			names = append(names, kind+"/"+name(i))
		}
	}
	vaps, err := reg.ValidatingAdmissionPolicies().List(ctx, metav1.ListOptions{})
	add("ValidatingAdmissionPolicy", len(vaps.Items), err, func(i int) string { return vaps.Items[i].Name })
	vapbs, err := reg.ValidatingAdmissionPolicyBindings().List(ctx, metav1.ListOptions{})
	add("ValidatingAdmissionPolicyBinding", len(vapbs.Items), err, func(i int) string { return vapbs.Items[i].Name })
	maps, err := reg.MutatingAdmissionPolicies().List(ctx, metav1.ListOptions{})
	add("MutatingAdmissionPolicy", len(maps.Items), err, func(i int) string { return maps.Items[i].Name })
	mapbs, err := reg.MutatingAdmissionPolicyBindings().List(ctx, metav1.ListOptions{})
	add("MutatingAdmissionPolicyBinding", len(mapbs.Items), err, func(i int) string { return mapbs.Items[i].Name })
	return names
}

// dryRunViolatingPod asks the API server to admit, without creating, a pod
// with NVIDIA_VISIBLE_DEVICES=all and no GPU limit, and returns the pod as
// admitted.
func dryRunViolatingPod(t *testing.T, ns string) (*corev1.Pod, error) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "miner"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "miner", Image: "busybox",
			Env: []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}}}},
	}
	return s.cp.Client.CoreV1().Pods(ns).Create(context.Background(), pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
}

// readmeBlocks returns the commands of each marked shell block of the
// README, continuation lines joined, comment lines left out.
func readmeBlocks(path string) (map[string][]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	marker := regexp.MustCompile(`^<!-- walkthrough: ([a-z-]+)\b.*-->$`)
	blocks := map[string][]string{}
	var name, pending string
	inBlock := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case !inBlock && marker.MatchString(line):
			name = marker.FindStringSubmatch(line)[1]
		case name != "" && !inBlock && strings.HasPrefix(line, "```"):
			inBlock = true
		case inBlock && strings.HasPrefix(line, "```"):
			inBlock, name = false, ""
		case inBlock:
			trimmed := strings.TrimSpace(line)
			if trimmed == "" || strings.HasPrefix(trimmed, "#") {
				continue
			}
			if cont, ok := strings.CutSuffix(trimmed, `\`); ok {
				pending += cont
				continue
			}
			blocks[name] = append(blocks[name], pending+trimmed)
			pending = ""
		}
	}
	return blocks, sc.Err()
}

// shell runs commands as a newcomer's terminal would: helm and kubectl on
// PATH, KUBECONFIG set, in the repository root.
type shell struct {
	t   *testing.T
	env []string
	// dir is the working directory, as a newcomer's home: files the README
	// writes (candidate.yaml) stay out of the checkout.
	dir string
}

func newShell(t *testing.T) *shell {
	kubeconfig, err := s.cp.Kubeconfig("newcomer")
	if err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	// The newcomer has logged in to the registry (docker login): helm and
	// make push read the credentials there. They have logged in to another
	// registry too, whose credentials the image pull secret must not get.
	if err := controlplane.WriteDockerConfig(filepath.Join(home, ".docker"), s.published.Registry, registryUser, s.registryPassword); err != nil {
		t.Fatal(err)
	}
	if err := addLogin(filepath.Join(home, ".docker", "config.json"), otherRegistry); err != nil {
		t.Fatal(err)
	}
	// The gpuguard CLI, as `make build` gives it.
	cli, err := framework.BuildGPUGuard(s.root, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return &shell{t: t, dir: home, env: []string{
		"PATH=" + filepath.Dir(cli) + ":" + s.assets + ":" + os.Getenv("PATH"),
		"KUBECONFIG=" + kubeconfig,
		// helm keeps its cache and configuration under HOME.
		"HOME=" + home,
		// Where `make push REGISTRY=...` published gpuguard, and the CA
		// that this machine's Go programs (helm) trust for it.
		"REGISTRY=" + s.published.Registry,
		// The pull token the README's install block makes the pull
		// secret from.
		"REGISTRY_USER=" + registryUser,
		"REGISTRY_PASSWORD=" + s.registryPassword,
		"SSL_CERT_FILE=" + s.registryCA,
	}}
}

// otherRegistry is a registry the newcomer has logged in to besides the
// cluster's.
const otherRegistry = "other-registry.example.com"

// addLogin adds credentials for registry to a docker config file.
func addLogin(path, registry string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var config map[string]map[string]any
	if err := json.Unmarshal(data, &config); err != nil {
		return err
	}
	config["auths"][registry] = map[string]string{"auth": base64.StdEncoding.EncodeToString([]byte("someone:elses-secret"))}
	if data, err = json.Marshal(config); err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o600)
}

// pullSecretHoldsOneRegistry: the README's image pull secret holds the
// credentials of the registry the images come from, and no other of the
// newcomer's logins.
func pullSecretHoldsOneRegistry(t *testing.T) {
	secret, err := s.cp.Client.CoreV1().Secrets("gpuguard").Get(context.Background(), "gpuguard-pull", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var config struct {
		Auths map[string]json.RawMessage `json:"auths"`
	}
	if err := json.Unmarshal(secret.Data[corev1.DockerConfigJsonKey], &config); err != nil {
		t.Fatalf("the pull secret's %s: %v", corev1.DockerConfigJsonKey, err)
	}
	registries := slices.Sorted(maps.Keys(config.Auths))
	if !slices.Equal(registries, []string{s.published.Registry}) {
		t.Errorf("the pull secret holds credentials for %v, want %s alone", registries, s.published.Registry)
	}
}

// publish runs a command of the README's publish block at the repository's
// root, as its reader would: with this machine's environment (its Go build
// cache among it) and the cluster's registry, trusted through its CA, for
// the README's. Then the walkthrough's REGISTRY is where it pushed.
func (sh *shell) publish(command string) (string, error) {
	registry := s.published.Registry + "/" + readmePath
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-o", "pipefail", "-c", strings.ReplaceAll(command, readmeRegistry, registry))
	cmd.Dir = s.root
	cmd.Env = append(os.Environ(), "SSL_CERT_FILE="+s.registryCA, "DOCKER_CONFIG="+filepath.Join(sh.dir, ".docker"))
	out, err := cmd.CombinedOutput()
	readmeRelease.Registry = registry
	sh.setEnv("REGISTRY", registry)
	return string(out), errors.Join(err, parsePushed(string(out), &readmeRelease))
}

func (sh *shell) setEnv(key, value string) {
	sh.env = append(slices.DeleteFunc(sh.env, func(kv string) bool { return strings.HasPrefix(kv, key+"=") }), key+"="+value)
}

func (sh *shell) run(command string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-o", "pipefail", "-c", command)
	cmd.Dir = sh.dir
	cmd.Env = sh.env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// pushedRef is an image make push printed it pushed, by digest.
var pushedRef = regexp.MustCompile(`(?m)^\s+(\S+/(gpuguard|gpuguard-agent)@sha256:[0-9a-f]{64})$`)

// parsePushed reads both images' references from make push's output.
func parsePushed(out string, p *kubenode.Published) error {
	for _, m := range pushedRef.FindAllStringSubmatch(out, -1) {
		switch m[2] {
		case "gpuguard":
			p.GPUGuard = m[1]
		case "gpuguard-agent":
			p.Agent = m[1]
		}
	}
	if p.GPUGuard == "" || p.Agent == "" {
		return errors.New("make push did not print both images by digest")
	}
	return nil
}

// pushedImages: what the README's block pushed is both images, each an
// index for every platform a release has, in the cluster's registry.
func pushedImages(t *testing.T) {
	for _, image := range []string{readmeRelease.GPUGuard, readmeRelease.Agent} {
		if !strings.HasPrefix(image, readmeRelease.Registry+"/") {
			t.Fatalf("%s was not pushed to %s", image, readmeRelease.Registry)
		}
		ref, err := name.NewDigest(image)
		if err != nil {
			t.Fatal(err)
		}
		index, err := remote.Index(ref, remote.WithTransport(s.registry.Transport()),
			remote.WithAuth(&authn.Basic{Username: registryUser, Password: s.registryPassword}))
		if err != nil {
			t.Fatal(err)
		}
		manifest, err := index.IndexManifest()
		if err != nil {
			t.Fatal(err)
		}
		var platforms []string
		for _, m := range manifest.Manifests {
			if m.Platform != nil {
				platforms = append(platforms, m.Platform.OS+"/"+m.Platform.Architecture)
			}
		}
		slices.Sort(platforms)
		if !slices.Equal(platforms, []string{"linux/amd64", "linux/arm64"}) {
			t.Errorf("%s is an index of %v, want linux/amd64 and linux/arm64", image, platforms)
		}
	}
}
