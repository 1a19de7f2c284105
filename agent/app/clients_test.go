package app

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// TestCreationCallsDoNotQueue: the calls a container's creation waits on
// (the enforcer's reads of pods) go through a client of their own without
// client-go's client-side limit (5 a second, bursts of 10), so that a burst
// of them all reach the API server at once, within a decision's budget;
// the client for Events keeps the limit. The server answers only once
// every read of the burst has arrived.
func TestCreationCallsDoNotQueue(t *testing.T) {
	const burst = 60
	_, unqueued := clientsOfBurstServer(t, burst)
	if failed := readBurst(unqueued, burst); failed != 0 {
		t.Errorf("%d of a burst of %d reads of pods failed within a decision's budget", failed, burst)
	}
	// The same burst through the Events client shows what the test
	// tells apart: most reads wait past the budget for their turn.
	kube, _ := clientsOfBurstServer(t, burst)
	if failed := readBurst(kube, burst); failed == 0 {
		t.Errorf("a burst of %d reads through the Events client all passed its client-side limit", burst)
	}
}

// clientsOfBurstServer serves pods only once burst reads have arrived, and
// returns the agent's two clients of it.
func clientsOfBurstServer(t *testing.T, burst int32) (kube, unqueued kubernetes.Interface) {
	t.Helper()
	var arrived atomic.Int32
	all := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if arrived.Add(1) == burst {
			close(all)
		}
		select {
		case <-all:
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"team-a"}}`)
	}))
	t.Cleanup(srv.Close)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`, srv.URL)
	if err := os.WriteFile(kubeconfig, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	kube, unqueued, _, err := apiClients(Config{Kubeconfig: kubeconfig})
	if err != nil {
		t.Fatal(err)
	}
	return kube, unqueued
}

// readBurst reads n pods at once, each within 5 s, and counts failures.
func readBurst(c kubernetes.Interface, n int) (failed int) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var failures atomic.Int32
	for i := range n {
		wg.Go(func() {
			if _, err := c.CoreV1().Pods("team-a").Get(ctx, fmt.Sprintf("p-%d", i), metav1.GetOptions{}); err != nil {
				failures.Add(1)
			}
		})
	}
	wg.Wait()
	return int(failures.Load())
}
