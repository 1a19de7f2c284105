package app

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpuguard/gpuguard/internal/wellknown"
)

// TestHardeningFollowsTheNodesConfiguration: a node hardened when the agent
// started, whose toolkit is then reconfigured to honour unprivileged device
// requests again, loses its hardened mark without a restart; and the labels
// are written when they change, not on every refresh.
func TestHardeningFollowsTheNodesConfiguration(t *testing.T) {
	root := t.TempDir()
	if err := os.CopyFS(root, os.DirFS("../nodereport/testdata/hardened")); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, shortDir(t), "hardened")
	cfg.HostRoot = root
	cfg.DevicePlugin = PluginOff
	cfg.HardeningInterval = 20 * time.Millisecond
	a, err := New(cfg, logr.Discard(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}})
	a.nodeLabels = &labelPublisher{client: client, nodeName: "node-1"}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, nil) }()
	defer func() {
		cancel()
		<-done
	}()
	waitMark(t, client, "true")
	// Several refreshes of an unchanged node write nothing more.
	waitPasses(t, a, a.hardeningPasses()+5)
	if n := patches(client); n != 1 {
		t.Errorf("%d label writes for an unchanged node, want the start's alone", n)
	}
	// As an installer does: a new file renamed over the old one.
	unhardened, err := os.ReadFile("../nodereport/testdata/default/etc/nvidia-container-runtime/config.toml")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root, "etc/nvidia-container-runtime/config.toml")
	if err := os.WriteFile(path+".new", unhardened, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
	waitMark(t, client, "false")
	if n := patches(client); n != 2 {
		t.Errorf("%d label writes, want 2: the start's and the change's", n)
	}
}

// waitMark waits for the node's hardened mark to read want.
func waitMark(t *testing.T, client *fake.Clientset, want string) {
	t.Helper()
	ctx := wait(t)
	for {
		node, err := client.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{})
		if err == nil && node.Labels[wellknown.HardenedMarkLabel] == want {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the hardened mark never read %q (labels %v, err %v)", want, node.GetLabels(), err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func waitPasses(t *testing.T, a *Agent, n int) {
	t.Helper()
	ctx := wait(t)
	for a.hardeningPasses() < n {
		select {
		case <-ctx.Done():
			t.Fatalf("the hardening report was computed %d times, want %d", a.hardeningPasses(), n)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func patches(client *fake.Clientset) int {
	n := 0
	for _, a := range client.Actions() {
		if a.GetVerb() == "patch" && a.GetResource().Resource == "nodes" {
			n++
		}
	}
	return n
}
