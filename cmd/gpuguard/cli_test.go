package main

import (
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/gpuguard/gpuguard/internal/kubeconfig"
)

// The container gets the last of several entries, as the kubelet builds it.
func TestGrantsAllGPUsLastEntryWins(t *testing.T) {
	env := func(values ...string) *corev1.Pod {
		c := corev1.Container{Name: "c"}
		for _, v := range values {
			c.Env = append(c.Env, corev1.EnvVar{Name: "NVIDIA_VISIBLE_DEVICES", Value: v})
		}
		return &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{c}}}
	}
	for _, tc := range []struct {
		pod  *corev1.Pod
		want bool
	}{
		{env("all"), true}, {env("all", "void"), false}, {env("void", "all"), true}, {env(), false}, {nil, false},
	} {
		if got := grantsAllGPUs(tc.pod); got != tc.want {
			t.Errorf("grantsAllGPUs(%v) = %v, want %v", tc.pod, got, tc.want)
		}
	}
}

// TestRestConfigIsNotThrottled: the webhook's API reads never queue behind
// client-go's default 5 requests a second, with a kubeconfig as in a cluster.
func TestRestConfigIsNotThrottled(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := restConfig(kubeconfig.Flags{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	cfg.GroupVersion = &corev1.SchemeGroupVersion
	cfg.APIPath = "/api"
	cfg.NegotiatedSerializer = scheme.Codecs.WithoutConversion()
	client, err := rest.RESTClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if client.GetRateLimiter() != nil {
		t.Errorf("the webhook's client is rate limited (QPS %v)", cfg.QPS)
	}
}
