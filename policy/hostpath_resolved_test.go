package policy_test

import (
	"testing"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/policy"
)

func TestResolvedHostPathReach(t *testing.T) {
	e, err := policy.New(config.Default())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path     string
		readOnly bool
		want     string
	}{
		{"/run/containerd/containerd.sock", true, "the sensitive path /run/containerd"},
		{"/var/run/containerd", true, "the sensitive path /run/containerd"},
		{"/etc/cdi", true, "the sensitive path /etc/cdi"},
		{"/etc/kubernetes/manifests/x.yaml", true, "the sensitive path /etc/kubernetes/manifests"},
		{"/", true, "a parent of the sensitive path /dev"},
		{"/etc/kubernetes", true, "a parent of the sensitive path /etc/kubernetes/manifests"},
		{"/var/lib/kubelet/pods/u/volumes", true, "the runtime-state tree /var/lib/kubelet"},
		{"/proc/1/root", true, "a per-process link of /proc"},
		{"/etc/ssh", false, "the system directory /etc, mounted read-write"},
		{"/etc/ssh", true, ""},
		{"/var/tmp/data", false, ""},
		{"/run/promtail", false, ""},
		{"/data/x", false, ""},
	} {
		if got := e.ResolvedHostPathReach(tc.path, tc.readOnly); got != tc.want {
			t.Errorf("ResolvedHostPathReach(%q, readOnly %v) = %q, want %q", tc.path, tc.readOnly, got, tc.want)
		}
	}
}

func TestPodMayPlantLinkIn(t *testing.T) {
	e, err := policy.New(config.Default())
	if err != nil {
		t.Fatal(err)
	}
	for dir, want := range map[string]bool{
		"/var/tmp":   true,
		"/var/tmp/a": true,
		"/data":      true,
		"/tmp":       true,
		"/var/lib/kubelet/pods/u/volumes/kubernetes.io~empty-dir/v": true,
		"/run/x":   true,
		"/":        false,
		"/etc":     false,
		"/var":     false,
		"/usr/lib": false,
		"/etc/cdi": false,
		"/dev":     false,
	} {
		if got := e.PodMayPlantLinkIn(dir); got != want {
			t.Errorf("PodMayPlantLinkIn(%q) = %v, want %v", dir, got, want)
		}
	}
}
