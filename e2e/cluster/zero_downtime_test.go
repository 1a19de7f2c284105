//go:build e2e

package cluster

import (
	"context"
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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpuguard/gpuguard/e2e/framework"
)

const (
	haReleaseNS = "gpuguard-ha"
	haTenantNS  = "ha-tenant"
)

// haSet adds chart values to the HA run's install, to see it fail with a
// known-bad setting (docs/reliability.md): -ha.set=webhook.replicas=1 or
// -ha.set=webhook.shutdownDelay=0s.
var haSet = flag.String("ha.set", "", "extra --set values for TestNoFailedAdmissionThroughUpgradeAndCrash's install")

// TestNoFailedAdmissionThroughUpgradeAndCrash installs the chart as it ships
// (two webhook replicas, a PodDisruptionBudget, a shutdown delay, enforce)
// and keeps several clients creating pods, a third of them leaking, while
// the webhook is upgraded (a new image digest and a policy change, rolled
// by helm upgrade --wait), one replica is killed with SIGKILL, and then every
// replica is evicted as a node drain does. No create the policy admits may
// fail, and none may be admitted unguarded: every admitted pod carries void,
// every leaking one is denied.
func TestNoFailedAdmissionThroughUpgradeAndCrash(t *testing.T) {
	ctx := context.Background()
	if err := framework.EnsureNamespace(ctx, s.cp, haTenantNS, nil); err != nil {
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
	if err := framework.WaitEnforcing(ctx, s.cp.Client, haTenantNS, time.Minute); err != nil {
		t.Fatal(err)
	}

	load := startCreates(t, ctx, 6)
	digest := repushedWebhookImage(t)
	upgrade := "helm upgrade gpuguard oci://$REGISTRY/charts/gpuguard -n " + haReleaseNS +
		" --reuse-values --wait --timeout 4m --set webhook.image.digest=" + digest +
		` --set-json 'policy.spec.exemptions.serviceAccounts=[{"namespace":"other-team","name":"exporter","rules":["privileged"]}]'`
	if out, err := sh.run(upgrade); err != nil {
		load.stop()
		t.Fatalf("%s: %v\n%s", upgrade, err, out)
	}
	rolled := load.count()
	runsDigest(t, ctx, digest)
	killOneWebhookReplica(t, ctx)
	evictWebhookReplicas(t, ctx)
	r := load.stop()
	t.Logf("ha: %d creates by 6 clients in %s (%.0f/s), %d through the upgrade; %d admitted with void, %d leaks denied, %d failed, %d unguarded",
		r.total, r.took.Round(time.Second), float64(r.total)/r.took.Seconds(), rolled, r.admitted, r.denied, r.failed, r.unguarded)
	if r.failed > 0 || r.unguarded > 0 {
		t.Errorf("%d creates the policy admits failed and %d were admitted unguarded; first: %s", r.failed, r.unguarded, r.first)
	}
	if r.total/int(r.took.Seconds()+1) < 50 {
		t.Errorf("the load ran at %d creates/s, under the 50/s it must keep", r.total/int(r.took.Seconds()+1))
	}
}

// loadResult is what the clients saw.
type loadResult struct {
	total, admitted, denied, failed, unguarded int
	took                                       time.Duration
	first                                      string
}

type load struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	n      atomic.Int64
	start  time.Time
	mu     sync.Mutex
	r      loadResult
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
	*outcome++
	if why != "" && l.r.first == "" {
		l.r.first = why
	}
}

// startCreates runs clients that create pods (dry run: admitted through
// every admission plugin, stored nowhere) until stopped: every third asks
// for every GPU without a GPU limit.
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
				leak := i%3 == 0
				pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ha-%d-%d", w, i)},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox"}}}}
				if leak {
					pod.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}
				}
				got, err := c.CoreV1().Pods(haTenantNS).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
				if ctx.Err() != nil {
					return
				}
				l.n.Add(1)
				switch {
				case err != nil && leak && (strings.Contains(err.Error(), "gpuguard denied") || strings.Contains(err.Error(), "gpuguard backstop")):
					l.record(&l.r.denied, "")
				case err != nil && !leak:
					l.record(&l.r.failed, err.Error())
				case err != nil:
					// A leak refused for another reason is not admitted; it
					// counts as a failure of the webhook all the same.
					l.record(&l.r.failed, err.Error())
				case leak:
					l.record(&l.r.unguarded, "a leaking pod was admitted")
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
	pods, err := s.cp.Client.CoreV1().Pods(haReleaseNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=webhook"})
	if err != nil {
		t.Fatal(err)
	}
	ready := 0
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil || len(p.Status.ContainerStatuses) == 0 || !p.Status.ContainerStatuses[0].Ready {
			continue
		}
		ready++
		if image := p.Spec.Containers[0].Image; !strings.HasSuffix(image, "@"+digest) {
			t.Errorf("after the upgrade, pod %s runs %s, not the new %s", p.Name, image, digest)
		}
	}
	if ready == 0 {
		t.Error("no ready webhook pod after the upgrade")
	}
}

// killOneWebhookReplica kills one serving replica's process with SIGKILL, as
// the kernel's OOM killer or a node fault would, and waits until the
// Deployment has every replica ready again.
func killOneWebhookReplica(t *testing.T, ctx context.Context) {
	t.Helper()
	pods, err := s.cp.Client.CoreV1().Pods(haReleaseNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=webhook"})
	if err != nil {
		t.Fatal(err)
	}
	var victim *corev1.Pod
	for i := range pods.Items {
		if p := &pods.Items[i]; p.DeletionTimestamp == nil && len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].Ready {
			victim = p
			break
		}
	}
	if victim == nil {
		t.Fatal("no ready webhook pod to kill")
	}
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

// evictWebhookReplicas evicts every webhook pod once through the Eviction
// API, as kubectl drain does (the PodDisruptionBudget refuses what would
// leave too few), and waits until the Deployment is whole again.
func evictWebhookReplicas(t *testing.T, ctx context.Context) {
	t.Helper()
	pods, err := s.cp.Client.CoreV1().Pods(haReleaseNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=webhook"})
	if err != nil {
		t.Fatal(err)
	}
	var evicted []string
	for _, p := range pods.Items {
		err := s.cp.Client.PolicyV1().Evictions(haReleaseNS).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace}})
		switch {
		case err == nil:
			evicted = append(evicted, p.Name)
		case !apierrors.IsTooManyRequests(err) && !apierrors.IsNotFound(err):
			t.Fatalf("evicting %s: %v", p.Name, err)
		}
	}
	if len(evicted) == 0 {
		t.Fatal("no webhook pod could be evicted")
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
