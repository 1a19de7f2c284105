//go:build e2e

package cluster

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpuguard/gpuguard/e2e/framework"
	"github.com/gpuguard/gpuguard/e2e/framework/controlplane"
)

const (
	haReleaseNS = "gpuguard-ha"
	haTenantNS  = "ha-tenant"
)

// haSet adds chart values to the HA run's install, to see it fail with a
// known-bad setting (docs/reliability.md): -ha.set=webhook.replicas=1 or
// -ha.set=webhook.shutdownDelay=0s.
var haSet = flag.String("ha.set", "", "extra --set values for TestNoFailedAdmissionThroughUpgradeAndCrash's install")

// drainHold is how long the drain keeps the node cordoned before the
// evicted replicas' replacements may start: on a one-node cluster, the time
// they take to be scheduled and pulled on another node.
const drainHold = 15 * time.Second

// exporter is the service account the policy changes of the run exempt
// from the privileged rule, and unexempt, to see each change in force.
const exporter = "exporter"

// TestNoFailedAdmissionThroughUpgradeAndCrash installs the chart as it ships
// (two webhook replicas, a PodDisruptionBudget, a shutdown delay, enforce)
// and keeps several clients creating pods, a third of them leaking, while:
// the webhook is upgraded (a new image digest and a policy change, rolled
// by helm upgrade --wait); one replica is killed with SIGKILL; the API
// server is restarted, which cuts every watch, and a policy change made
// after it must reach every replica; the node is drained (cordoned, every
// replica evicted as kubectl drain does, the replacements kept off the
// node for drainHold). The load's pods are in thirds: leaking, which the
// backstop denies alone; plain, which it gives void alone; and one-GPU pods
// with their settings from a ConfigMap, which only the webhook judges.
// No create the policy admits may fail, and none may be admitted
// unguarded: every leaking pod is denied, every plain one carries void.
// Two exceptions, counted apart and logged: while the API server itself
// restarts, creates may fail with its own errors; and the webhook calls
// lost with the replica killed by SIGKILL (the one the API server is
// calling), which the API server never retries.
func TestNoFailedAdmissionThroughUpgradeAndCrash(t *testing.T) {
	ctx := context.Background()
	if err := controlplane.EnsureNamespace(ctx, s.cp, haTenantNS, nil); err != nil {
		t.Fatal(err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: exporter}}
	if _, err := s.cp.Client.CoreV1().ServiceAccounts(haTenantNS).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	settings := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: haSettings}, Data: map[string]string{"LOG_LEVEL": "info", "BATCH_SIZE": "64"}}
	if _, err := s.cp.Client.CoreV1().ConfigMaps(haTenantNS).Create(ctx, settings, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	sh := newShell(t)
	release := "helm install gpuguard oci://$REGISTRY/charts/gpuguard -n " + haReleaseNS +
		" --create-namespace --wait --timeout 4m --set policy.mode=enforce"
	if *haSet != "" {
		release += " --set " + *haSet
	}
	if out, err := sh.run(release); err != nil {
		t.Fatalf("%s: %v\n%s", release, err, out)
	}
	t.Cleanup(func() {
		if out, err := sh.run("helm uninstall gpuguard -n " + haReleaseNS + " --wait"); err != nil {
			t.Errorf("helm uninstall: %v\n%s", err, out)
		}
		nothingLeftBlocking(t)
	})
	// The webhook enforces before the load starts.
	if err := controlplane.WaitEnforcing(ctx, s.cp.Client, haTenantNS, time.Minute); err != nil {
		t.Fatal(err)
	}
	waitExporterAdmitted(t, ctx, false)

	load := startCreates(t, ctx, 6)
	load.during("the upgrade")
	digest := repushedWebhookImage(t)
	upgrade := "helm upgrade gpuguard oci://$REGISTRY/charts/gpuguard -n " + haReleaseNS +
		" --reuse-values --wait --timeout 4m --set webhook.image.digest=" + digest +
		` --set-json 'policy.spec.exemptions.serviceAccounts=[{"namespace":"` + haTenantNS + `","name":"` + exporter + `","rules":["privileged"]}]'`
	if out, err := sh.run(upgrade); err != nil {
		load.stop()
		t.Fatalf("%s: %v\n%s", upgrade, err, out)
	}
	rolled := load.count()
	runsDigest(t, ctx, digest)
	waitExporterAdmitted(t, ctx, true)
	load.during(killStep)
	killOneWebhookReplica(t, ctx)
	load.during("the API server's restart")
	restartAPIServer(t, ctx, load)
	load.during("the policy change after the restart")
	// A policy change after the restart, which rolls nothing: every replica
	// must see it through its resumed watch.
	exempting := policyInForce(t, ctx)
	if exempting == "" {
		t.Fatal("the webhook replicas do not agree on the policy in force")
	}
	unexempt := "helm upgrade gpuguard oci://$REGISTRY/charts/gpuguard -n " + haReleaseNS +
		" --reuse-values --wait --timeout 4m --set-json 'policy.spec.exemptions.serviceAccounts=[]'"
	if out, err := sh.run(unexempt); err != nil {
		load.stop()
		t.Fatalf("%s: %v\n%s", unexempt, err, out)
	}
	waitPolicyChanged(t, ctx, exempting)
	waitExporterAdmitted(t, ctx, false)
	load.during("the drain")
	drainWebhookNode(t, ctx)
	r := load.stop()
	t.Logf("ha: %d creates by 6 clients in %s (%.0f/s), %d through the upgrade; %d admitted with void, %d GPU pods admitted by the webhook, %d leaks denied, %d failed, %d unguarded; %d refused by the API server while it restarted; %d webhook calls lost with the killed replica",
		r.total, r.took.Round(time.Second), float64(r.total)/r.took.Seconds(), rolled, r.admitted, r.webhookAdmitted, r.denied, r.failed, r.unguarded, r.apiServerDown, r.lostToKill)
	if r.failed > 0 || r.unguarded > 0 {
		t.Errorf("%d creates the policy admits failed and %d were admitted unguarded, by step %v; first %s", r.failed, r.unguarded, r.byStep, r.first)
	}
	if r.total/int(r.took.Seconds()+1) < 50 {
		t.Errorf("the load ran at %d creates/s, under the 50/s it must keep", r.total/int(r.took.Seconds()+1))
	}
}

// waitExporterAdmitted waits until a privileged pod of the exporter service
// account is admitted (want) or denied ten times in a row: the replica the
// API server calls, and the backstop, have the policy that says so.
func waitExporterAdmitted(t *testing.T, ctx context.Context, want bool) {
	t.Helper()
	privileged := true
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "ha-exporter"}, Spec: corev1.PodSpec{ServiceAccountName: exporter,
		Containers: []corev1.Container{{Name: "exporter", Image: "busybox", SecurityContext: &corev1.SecurityContext{Privileged: &privileged}}}}}
	inARow, last := 0, ""
	err := framework.Poll(ctx, 2*time.Minute, func() (bool, error) {
		_, err := s.cp.Client.CoreV1().Pods(haTenantNS).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		switch admitted := err == nil; {
		case admitted == want:
			inARow++
		case admitted:
			inARow, last = 0, "admitted"
		case !isDenial(err):
			return false, fmt.Errorf("the exporter's pod failed admission: %w", err)
		default:
			inARow, last = 0, err.Error()
		}
		return inARow >= 10, nil
	})
	if err != nil {
		t.Fatalf("want the exporter's privileged pod admitted=%v by every replica: %v (last: %s)", want, err, last)
	}
}

// isDenial: err is gpuguard's, or its backstop's, denial.
func isDenial(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "gpuguard denied") || strings.Contains(err.Error(), "gpuguard backstop"))
}

// restartAPIServer restarts the API server under the load, which cuts
// every watch the webhook holds; while it is down the load's creates may
// fail with the API server's own errors, and only then.
func restartAPIServer(t *testing.T, ctx context.Context, l *load) {
	t.Helper()
	l.apiServerDown.Store(true)
	defer l.apiServerDown.Store(false)
	if err := s.cp.RestartAPIServer(ctx); err != nil {
		t.Fatalf("restarting the API server: %v\n%s", err, s.cp.LogTails())
	}
}

// loadResult is what the clients saw.
type loadResult struct {
	total, admitted, denied, failed, unguarded int
	// webhookAdmitted counts the GPU pods with settings from a ConfigMap,
	// which only the webhook judges (the pre-filter sends it the rest
	// only when they need it; the backstop decides the plain and leaking
	// pods alone).
	webhookAdmitted int
	// apiServerDown counts the creates the API server refused, or did not
	// answer, while it restarted.
	apiServerDown int
	took          time.Duration
	first         string
	// byStep counts the failed and unguarded creates by step.
	byStep map[string]int
	// lostToKill counts the creates whose webhook call was lost with the
	// replica killed by SIGKILL: in flight on it, or sent on a connection
	// to it before its endpoint was gone (the API server calls a webhook
	// once, never again; docs/reliability.md).
	lostToKill int
}

// killStep is the step whose lost webhook calls are counted apart.
const killStep = "the SIGKILL of a replica"

// lostWithReplica: the API server's call to the webhook failed in its
// transport, with no answer from a replica: in flight on the killed one
// (EOF, reset), written onto a kept-alive connection to it that its kernel
// or the API server's transport had already closed (broken pipe, use of a
// closed connection), or sent to its address before its endpoint went
// (refused). The class, not a list of the messages Go's transport gives
// it. A timeout is not in it: a SIGKILL closes the replica's sockets at
// once, so a call that hangs is something else.
func lostWithReplica(why string) bool {
	if !strings.Contains(why, "failed calling webhook") || !strings.Contains(why, `failed to call webhook: Post "`) {
		return false
	}
	for _, hung := range []string{"deadline exceeded", "Client.Timeout", "i/o timeout"} {
		if strings.Contains(why, hung) {
			return false
		}
	}
	return true
}

type load struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	n      atomic.Int64
	start  time.Time
	mu     sync.Mutex
	r      loadResult
	step   string
	// apiServerDown is set while the API server restarts.
	apiServerDown atomic.Bool
}

func (l *load) count() int { return int(l.n.Load()) }

func (l *load) stop() loadResult {
	l.cancel()
	l.wg.Wait()
	l.r.took = time.Since(l.start)
	l.r.total = l.count()
	return l.r
}

func (l *load) record(outcome *int, why string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if outcome == &l.r.failed && l.step == killStep && lostWithReplica(why) {
		outcome = &l.r.lostToKill
	}
	*outcome++
	if why == "" || outcome == &l.r.lostToKill {
		return
	}
	step := l.step
	if l.r.byStep == nil {
		l.r.byStep = map[string]int{}
	}
	l.r.byStep[step]++
	if l.r.first == "" {
		l.r.first = "during " + step + ": " + why
	}
}

// during names the step the load's failures are counted under.
func (l *load) during(step string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.step = step
}

// haSettings is the ConfigMap of ordinary settings the load's GPU pods
// take their environment from.
const haSettings = "ha-settings"

// startCreates runs clients that create pods (dry run: admitted through
// every admission plugin, stored nowhere) until stopped, in thirds: pods
// that ask for every GPU without a GPU limit, which the backstop denies
// alone; one-GPU pods with their settings from a ConfigMap, which only the
// webhook judges; plain pods, which the backstop gives void alone.
func startCreates(t *testing.T, ctx context.Context, clients int) *load {
	t.Helper()
	cfg := rest.CopyConfig(s.cp.Config)
	cfg.QPS, cfg.Burst = 500, 1000
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	l := &load{cancel: cancel, start: time.Now()}
	for w := range clients {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				leak, gpu := i%3 == 0, i%3 == 1
				pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ha-%d-%d", w, i)},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox"}}}}
				switch {
				case leak:
					pod.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}
				case gpu:
					// Only the webhook judges it: the backstop cannot read
					// the ConfigMap its environment comes from.
					pod.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}
					pod.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{
						LocalObjectReference: corev1.LocalObjectReference{Name: haSettings}}}}
				}
				got, err := c.CoreV1().Pods(haTenantNS).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
				if ctx.Err() != nil {
					return
				}
				l.n.Add(1)
				switch {
				case err != nil && l.apiServerDown.Load() && apiServerUnavailable(err):
					l.record(&l.r.apiServerDown, "")
					// As a client backs off, leaving the restart its CPU.
					select {
					case <-ctx.Done():
					case <-time.After(100 * time.Millisecond):
					}
				case leak && isDenial(err):
					l.record(&l.r.denied, "")
				case err != nil && !leak:
					l.record(&l.r.failed, err.Error())
				case err != nil:
					// A leak refused for another reason is not admitted; it
					// counts as a failure of the webhook all the same.
					l.record(&l.r.failed, err.Error())
				case leak:
					l.record(&l.r.unguarded, "a leaking pod was admitted")
				case gpu && framework.LastEnv(got.Spec.Containers[0], "NVIDIA_VISIBLE_DEVICES") != "<unset>":
					l.record(&l.r.unguarded, "a GPU pod was admitted with NVIDIA_VISIBLE_DEVICES set")
				case gpu:
					l.record(&l.r.webhookAdmitted, "")
				case framework.LastEnv(got.Spec.Containers[0], "NVIDIA_VISIBLE_DEVICES") != "void":
					l.record(&l.r.unguarded, "a pod was admitted without void")
				default:
					l.record(&l.r.admitted, "")
				}
			}
		}()
	}
	return l
}

// apiServerUnavailable: err is the API server's own unavailability, not an
// admission decision: no answer at all, its refusal while it shuts down or
// starts (503, 429), or its admission plugins not yet ready. A webhook that
// cannot be called is a 500 ("failed calling webhook") and is not one.
func apiServerUnavailable(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return true
	}
	code := status.Status().Code
	return code == 503 || code == 429 || strings.Contains(err.Error(), "not yet ready to handle request")
}

// repushedWebhookImage pushes the published gpuguard image again with one
// more annotation: the same program under a new digest, as a release is.
func repushedWebhookImage(t *testing.T) string {
	t.Helper()
	ref, err := name.NewDigest(s.published.GPUGuard)
	if err != nil {
		t.Fatal(err)
	}
	opt := remote.WithTransport(s.registry.Transport())
	index, err := remote.Index(ref, opt)
	if err != nil {
		t.Fatal(err)
	}
	next, ok := mutate.Annotations(index, map[string]string{"org.opencontainers.image.version": "upgraded"}).(v1.ImageIndex)
	if !ok {
		t.Fatal("an annotated index is no index")
	}
	if err := remote.WriteIndex(ref.Context().Tag("upgraded"), next, opt); err != nil {
		t.Fatal(err)
	}
	digest, err := next.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return digest.String()
}

// runsDigest checks that the upgrade rolled the serving pods onto the new
// image: every ready pod not terminating names it. (The runtime reports the
// image it pulled first for the same platform image, so the spec is what
// tells the new pods.)
func runsDigest(t *testing.T, ctx context.Context, digest string) {
	t.Helper()
	for _, p := range readyWebhookPods(t, ctx) {
		if image := p.Spec.Containers[0].Image; !strings.HasSuffix(image, "@"+digest) {
			t.Errorf("after the upgrade, pod %s runs %s, not the new %s", p.Name, image, digest)
		}
	}
}

// killOneWebhookReplica kills the replica taking the most calls with
// SIGKILL, as the kernel's OOM killer or a node fault would, and waits
// until the Deployment has every replica ready again.
func killOneWebhookReplica(t *testing.T, ctx context.Context) {
	t.Helper()
	victim := calledReplica(t, ctx)
	id := victim.Status.ContainerStatuses[0].ContainerID
	_, id, _ = strings.Cut(id, "://")
	pids, err := processesOfContainer(id)
	if err != nil || len(pids) == 0 {
		t.Fatalf("no process of container %s (%s): %v", id, victim.Name, err)
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	err = framework.Poll(ctx, 2*time.Minute, func() (bool, error) {
		p, err := s.cp.Client.CoreV1().Pods(haReleaseNS).Get(ctx, victim.Name, metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) == 0 {
			return false, nil
		}
		st := p.Status.ContainerStatuses[0]
		return st.RestartCount > victim.Status.ContainerStatuses[0].RestartCount && st.Ready, nil
	})
	if err != nil {
		t.Fatalf("the killed replica %s did not come back ready: %v", victim.Name, err)
	}
}

// calledReplica is the ready webhook replica whose admission decisions grow
// fastest under the load: the API server calls a webhook over keep-alive
// connections, each held to the replica it was opened to, so the calls are
// seldom even, and killing an idle replica would test little.
func calledReplica(t *testing.T, ctx context.Context) *corev1.Pod {
	t.Helper()
	decisions := func(p *corev1.Pod) float64 {
		return framework.SumMetrics(replicaMetrics(t, ctx, p), framework.MetricPrefix("gpuguard_admission_decisions_total"))
	}
	ready := readyWebhookPods(t, ctx)
	var before []float64
	for _, p := range ready {
		before = append(before, decisions(p))
	}
	var called *corev1.Pod
	err := framework.Poll(ctx, time.Minute, func() (bool, error) {
		most := 0.0
		for i, p := range ready {
			if grew := decisions(p) - before[i]; grew > most {
				called, most = p, grew
			}
		}
		return most >= 50, nil
	})
	if err != nil {
		t.Fatalf("no webhook replica decided 50 reviews under the load: %v", err)
	}
	return called
}

// readyWebhookPods are the webhook's ready pods that are not terminating.
func readyWebhookPods(t *testing.T, ctx context.Context) []*corev1.Pod {
	t.Helper()
	var ready []*corev1.Pod
	for _, p := range webhookPods(t, ctx) {
		if p.DeletionTimestamp == nil && len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].Ready {
			ready = append(ready, p)
		}
	}
	if len(ready) == 0 {
		t.Fatal("no ready webhook pod")
	}
	return ready
}

// webhookPods are the release's webhook pods.
func webhookPods(t *testing.T, ctx context.Context) []*corev1.Pod {
	t.Helper()
	pods, err := s.cp.Client.CoreV1().Pods(haReleaseNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=webhook"})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]*corev1.Pod, len(pods.Items))
	for i := range pods.Items {
		out[i] = &pods.Items[i]
	}
	return out
}

// replicaMetrics reads one webhook pod's metrics (the chart's port 8080).
func replicaMetrics(t *testing.T, ctx context.Context, p *corev1.Pod) map[string]float64 {
	t.Helper()
	m, err := framework.Scrape(ctx, fmt.Sprintf("http://%s:8080/metrics", p.Status.PodIP))
	if err != nil {
		t.Fatalf("reading webhook pod %s's metrics: %v", p.Name, err)
	}
	return m
}

// policyInForce is the hash of the policy every ready replica has in force
// (gpuguard_policy_info), or "" while they differ.
func policyInForce(t *testing.T, ctx context.Context) string {
	t.Helper()
	hashes := map[string]bool{}
	for _, p := range readyWebhookPods(t, ctx) {
		hash := ""
		for k, v := range replicaMetrics(t, ctx, p) {
			if _, rest, ok := strings.Cut(k, `gpuguard_policy_info{hash="`); ok && v == 1 {
				hash, _, _ = strings.Cut(rest, `"`)
			}
		}
		hashes[hash] = true
	}
	if len(hashes) != 1 {
		return ""
	}
	for h := range hashes {
		return h
	}
	return ""
}

// waitPolicyChanged waits until every ready replica has one policy in
// force, and not the one before: the API server calls one replica, so
// decisions alone would not show the others have it.
func waitPolicyChanged(t *testing.T, ctx context.Context, before string) {
	t.Helper()
	err := framework.Poll(ctx, 2*time.Minute, func() (bool, error) {
		h := policyInForce(t, ctx)
		return h != "" && h != before, nil
	})
	if err != nil {
		t.Fatalf("the replicas did not all put the changed policy in force (it was %s before): %v", before, err)
	}
}

// drainWebhookNode drains the webhook's node as kubectl drain does: it
// cordons the node, then evicts every webhook pod through the Eviction API,
// again and again while the PodDisruptionBudget refuses. The node stays
// cordoned for drainHold, so the evicted replicas' replacements cannot start
// beside them, as on a real cluster they start on another node, after a
// pull; then it is uncordoned, the drain finishes, and the Deployment must
// be whole again.
func drainWebhookNode(t *testing.T, ctx context.Context) {
	t.Helper()
	pods := webhookPods(t, ctx)
	if len(pods) == 0 {
		t.Fatal("no webhook pod to drain")
	}
	node := pods[0].Spec.NodeName
	setUnschedulable(t, ctx, node, true)
	t.Cleanup(func() { setUnschedulable(t, context.Background(), node, false) })
	cordoned := time.Now()
	pending := map[string]bool{}
	for _, p := range pods {
		pending[p.Name] = true
	}
	var evicted []string
	uncordoned := false
	err := framework.Poll(ctx, 3*time.Minute, func() (bool, error) {
		for name := range pending {
			err := s.cp.Client.PolicyV1().Evictions(haReleaseNS).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: haReleaseNS}})
			switch {
			case err == nil:
				evicted = append(evicted, name)
				delete(pending, name)
			case apierrors.IsNotFound(err):
				delete(pending, name)
			case !apierrors.IsTooManyRequests(err): // the budget's refusal is retried
				return false, fmt.Errorf("evicting %s: %w", name, err)
			}
		}
		if !uncordoned && time.Since(cordoned) >= drainHold {
			setUnschedulable(t, ctx, node, false)
			uncordoned = true
		}
		return len(pending) == 0, nil
	})
	if err != nil {
		t.Fatalf("draining node %s: %v (evicted %v)", node, err, evicted)
	}
	// Gone first, so that the Deployment's status below is the one after.
	err = framework.Poll(ctx, 2*time.Minute, func() (bool, error) {
		for _, name := range evicted {
			if _, err := s.cp.Client.CoreV1().Pods(haReleaseNS).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("the evicted webhook pods %v did not go: %v", evicted, err)
	}
	if !uncordoned {
		setUnschedulable(t, ctx, node, false)
	}
	err = framework.Poll(ctx, 2*time.Minute, func() (bool, error) {
		d, err := s.cp.Client.AppsV1().Deployments(haReleaseNS).Get(ctx, "gpuguard-webhook", metav1.GetOptions{})
		if err != nil || d.Spec.Replicas == nil {
			return false, nil
		}
		return d.Status.ReadyReplicas == *d.Spec.Replicas && d.Status.UpdatedReplicas == *d.Spec.Replicas && d.Status.Replicas == *d.Spec.Replicas, nil
	})
	if err != nil {
		t.Fatalf("the webhook Deployment did not recover from the drain: %v", err)
	}
}

// setUnschedulable cordons or uncordons a node.
func setUnschedulable(t *testing.T, ctx context.Context, node string, on bool) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"unschedulable":%t}}`, on)
	if _, err := s.cp.Client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Errorf("setting node %s unschedulable=%t: %v", node, on, err)
	}
}

// processesOfContainer finds the processes whose cgroup names the container.
func processesOfContainer(id string) ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cgroup, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if err != nil { // gone, or not ours to read
			continue
		}
		if strings.Contains(string(cgroup), id) {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}
