package enforcer

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpuguard/gpuguard/agent/verifier"
	"github.com/gpuguard/gpuguard/policy"
)

// hostRoot is a host file system in a temporary directory: the runtime's
// socket directory, /etc/cdi, a data directory (/var/tmp) and an unlisted
// one (/data) with links planted in them, and the host's own links.
func hostRoot(t *testing.T) *HostResolver {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"run/containerd", "run/systemd/resolve", "etc/cdi", "var/tmp/plain", "data", "usr/share/zoneinfo/Etc", "var/lib/kubelet/pods/u1/volumes"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{
		"var/tmp/abs":                       "/run/containerd",       // absolute
		"var/tmp/rel":                       "../../etc/cdi",         // relative
		"var/tmp/chain":                     "/data/hop",             // a chain: /data/hop leads on
		"data/hop":                          "../var/tmp/abs",        //
		"var/tmp/escape":                    "../../../../../../etc", // .. beyond the root stays at it
		"var/tmp/loop":                      "loop2",                 // a loop
		"var/tmp/loop2":                     "loop",
		"var/tmp/data":                      "/data", // harmless: an unlisted directory
		"var/tmp/root":                      "/",
		"var/run":                           "../run", // the host's own
		"etc/resolv.conf":                   "../run/systemd/resolve/stub-resolv.conf",
		"etc/localtime":                     "/usr/share/zoneinfo/Etc/UTC",
		"etc/cdi-alias":                     "/run/containerd", // a link in a system directory: the host's
		"var/lib/kubelet/pods/u1/volumes/x": "/etc/cdi",
	} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	h, err := NewHostResolver(root)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestHostResolverResolve(t *testing.T) {
	h := hostRoot(t)
	for _, tc := range []struct {
		path, want string
		links      []string
	}{
		{"/var/tmp/plain/x", "/var/tmp/plain/x", nil},
		{"/var/tmp/abs/containerd.sock", "/run/containerd/containerd.sock", []string{"/var/tmp/abs"}},
		{"/var/tmp/rel", "/etc/cdi", []string{"/var/tmp/rel"}},
		{"/var/tmp/chain/containerd.sock", "/run/containerd/containerd.sock", []string{"/var/tmp/chain", "/data/hop", "/var/tmp/abs"}},
		{"/var/tmp/escape/cdi", "/etc/cdi", []string{"/var/tmp/escape"}},
		{"/var/tmp/../../../etc/cdi", "/etc/cdi", nil},
		{"/var/tmp/abs/../nri", "/run/nri", []string{"/var/tmp/abs"}},
		{"/var/run/containerd", "/run/containerd", []string{"/var/run"}},
		{"/missing/x", "/missing/x", nil},
	} {
		got, links, err := h.Resolve(tc.path)
		if err != nil || got != tc.want || !slices.Equal(links, tc.links) {
			t.Errorf("Resolve(%q) = %q, %q, %v; want %q, %q", tc.path, got, links, err, tc.want, tc.links)
		}
	}
	if _, _, err := h.Resolve("/var/tmp/loop/x"); !errors.Is(err, syscall.ELOOP) {
		t.Errorf("Resolve of a link loop: %v, want ELOOP", err)
	}
}

// TestDecideMountSources: a mount whose name leads through a link a pod may
// have planted into a guarded host path gets the container refused, naming
// the mount, the name and where it leads; the host's own links, the
// kubelet's and containerd's mounts and paths that lead nowhere guarded
// pass.
func TestDecideMountSources(t *testing.T) {
	h := hostRoot(t)
	r := testRules(t).WithHostRoot(h)
	own := []Mount{
		{Destination: "/etc/hosts", Source: "/var/lib/kubelet/pods/u1/etc-hosts"},
		{Destination: "/var/run/secrets/kubernetes.io/serviceaccount", Source: "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~projected/token", ReadOnly: true},
		{Destination: "/etc/hostname", Source: "/run/containerd/io.containerd.grpc.v1.cri/sandboxes/s1/hostname"},
		{Destination: "/dev/shm", Source: "/run/containerd/io.containerd.grpc.v1.cri/sandboxes/s1/shm"},
		{Destination: "/proc", Source: "proc"},
	}
	ctr := func(mounts ...Mount) Container {
		return Container{PodUID: "u1", SandboxID: "s1", Mounts: slices.Concat(own, mounts)}
	}
	read := func(h ...HostPathMount) Facts { return Facts{PodRead: true, HostPaths: h} }
	for _, tc := range []struct {
		name     string
		c        Container
		f        Facts
		refuse   []string // what the reason names
		needsPod bool
	}{
		{name: "the kubelet's and containerd's own mounts", c: ctr()},
		{name: "a source through a planted link", c: ctr(Mount{Destination: "/sock", Source: "/var/tmp/abs/containerd.sock"}),
			refuse: []string{"/sock", "/var/tmp/abs/containerd.sock", "/run/containerd/containerd.sock", "the sensitive path /run/containerd", "link /var/tmp/abs"}},
		{name: "a hostPath name through a relative link, read-only", c: ctr(Mount{Destination: "/cdi", Source: "/etc/cdi", ReadOnly: true}),
			f:      read(HostPathMount{Destination: "/cdi", Name: "/var/tmp/rel", ReadOnly: true}),
			refuse: []string{"/cdi", "/var/tmp/rel", "/etc/cdi", "the sensitive path /etc/cdi"}},
		{name: "a chain through an unlisted directory", c: ctr(),
			f:      read(HostPathMount{Destination: "/s", Name: "/var/tmp/chain/containerd.sock"}),
			refuse: []string{"/var/tmp/chain/containerd.sock", "/run/containerd/containerd.sock"}},
		{name: ".. beyond the host root stays at it", c: ctr(),
			f:      read(HostPathMount{Destination: "/e", Name: "/var/tmp/escape/cdi"}),
			refuse: []string{"/var/tmp/escape/cdi", "/etc/cdi"}},
		{name: "a link to the host's root", c: ctr(), f: read(HostPathMount{Destination: "/h", Name: "/var/tmp/root", ReadOnly: true}),
			refuse: []string{"/var/tmp/root", "a parent of the sensitive path"}},
		{name: "a subPath through a planted link", c: ctr(), f: read(HostPathMount{Destination: "/k", Name: "/var/tmp/abs/containerd.sock"}),
			refuse: []string{"/var/tmp/abs/containerd.sock"}},
		{name: "a link planted in an emptyDir", c: ctr(), f: read(HostPathMount{Destination: "/x", Name: "/var/lib/kubelet/pods/u1/volumes/x"}),
			refuse: []string{"/var/lib/kubelet/pods/u1/volumes/x", "/etc/cdi"}},
		{name: "a link loop", c: ctr(), f: read(HostPathMount{Destination: "/l", Name: "/var/tmp/loop"}),
			refuse: []string{"/l", "/var/tmp/loop", "cannot resolve"}},
		{name: "a source that is a link loop", c: ctr(Mount{Destination: "/l", Source: "/var/tmp/loop"}),
			refuse: []string{"/l", "/var/tmp/loop", "cannot resolve"}},
		{name: "the runtime resolved the name elsewhere than the enforcer sees", c: ctr(Mount{Destination: "/d", Source: "/run/containerd"}),
			f:      read(HostPathMount{Destination: "/d", Name: "/var/tmp/plain/late"}),
			refuse: []string{"/d", "/var/tmp/plain/late", "resolved to /run/containerd", "the sensitive path /run/containerd"}},
		{name: "a subPath bound from the pod's directory", c: ctr(Mount{Destination: "/k", Source: "/var/lib/kubelet/pods/u1/volume-subpaths/v/c/0"}),
			f: read(HostPathMount{Destination: "/k", Name: "/var/tmp/plain/sub"})},
		{name: "a link to an unlisted directory", c: ctr(Mount{Destination: "/d", Source: "/data"}),
			f: read(HostPathMount{Destination: "/d", Name: "/var/tmp/data"})},
		{name: "a data directory mounted itself", c: ctr(Mount{Destination: "/t", Source: "/var/tmp/plain"}),
			f: read(HostPathMount{Destination: "/t", Name: "/var/tmp/plain"})},
		{name: "the host's own links", c: ctr(Mount{Destination: "/etc/resolv.conf", Source: "/run/systemd/resolve/stub-resolv.conf", ReadOnly: true}),
			f: read(HostPathMount{Destination: "/etc/resolv.conf", Name: "/etc/resolv.conf", ReadOnly: true},
				HostPathMount{Destination: "/etc/localtime", Name: "/etc/localtime"},
				HostPathMount{Destination: "/c", Name: "/etc/cdi-alias"},
				HostPathMount{Destination: "/r", Name: "/var/run/containerd"})},
		{name: "a guarded source without the pod read", c: ctr(Mount{Destination: "/cdi", Source: "/etc/cdi", ReadOnly: true}),
			refuse: []string{"cannot be read"}, needsPod: true},
		{name: "another pod's state without the pod read", c: ctr(Mount{Destination: "/t", Source: "/var/lib/kubelet/pods/u2/volumes/x", ReadOnly: true}),
			refuse: []string{"cannot be read"}, needsPod: true},
		{name: "a subPath without the pod read", c: ctr(Mount{Destination: "/k", Source: "/var/lib/kubelet/pods/u1/volume-subpaths/v/c/0"}),
			refuse: []string{"cannot be read"}, needsPod: true},
		{name: "the device plugin's device-list mount", c: ctr(Mount{Destination: mountRoot + "/GPU-a", Source: "/dev/null"})},
		{name: "a guarded source the pod named itself", c: ctr(Mount{Destination: "/cdi", Source: "/etc/cdi", ReadOnly: true}),
			f: read(HostPathMount{Destination: "/cdi", Name: "/etc/cdi", ReadOnly: true})},
		{name: "waived", c: ctr(Mount{Destination: "/sock", Source: "/var/tmp/abs/containerd.sock"}),
			f: Facts{Exempt: "service account a/b", Waived: policy.RuleSet{policy.RuleSensitiveHostPath: true, policy.RuleHostPathLink: true}}},
		{name: "exempt", c: ctr(Mount{Destination: "/sock", Source: "/var/tmp/abs/containerd.sock"}), f: Facts{Exempt: "namespace kube-system"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := r.Decide(tc.c, tc.f)
			if (d.Refuse != "") != (len(tc.refuse) > 0) || d.NeedsPod() != tc.needsPod {
				t.Fatalf("refuse %q, needs the pod %v; want refused naming %q, needs the pod %v", d.Refuse, d.NeedsPod(), tc.refuse, tc.needsPod)
			}
			for _, want := range tc.refuse {
				if !strings.Contains(d.Refuse, want) {
					t.Errorf("reason %q does not name %q", d.Refuse, want)
				}
			}
		})
	}
}

func TestHostPathMountsOf(t *testing.T) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{
		Volumes: []corev1.Volume{
			{Name: "h", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/tmp/x/"}}},
			{Name: "e", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		},
		Containers: []corev1.Container{{Name: "c", VolumeMounts: []corev1.VolumeMount{
			{Name: "h", MountPath: "/a", ReadOnly: true}, {Name: "h", MountPath: "/b", SubPath: "s/t"}, {Name: "e", MountPath: "/e"},
			{Name: "h", MountPath: "/c", SubPathExpr: "$(POD)"},
		}}},
	}}
	want := []HostPathMount{{"/a", "/var/tmp/x", true}, {"/b", "/var/tmp/x/s/t", false}, {"/c", "/var/tmp/x", false}}
	if got := HostPathMountsOf(pod, "c"); !slices.Equal(got, want) {
		t.Errorf("HostPathMountsOf = %v, want %v", got, want)
	}
	// A container the pod read does not name (an ephemeral container added
	// since): every hostPath volume of the pod.
	if got := HostPathMountsOf(pod, "debug"); !slices.Equal(got, []HostPathMount{{"(volume h)", "/var/tmp/x", false}}) {
		t.Errorf("HostPathMountsOf an unknown container = %v", got)
	}
}

// TestPlantedLinkThroughPlugin: at creation, as containerd shows it (the
// hostPath's link already followed), a container whose mount source lies
// in a guarded path gets its pod read, once, and is refused where the name
// leads there through a planted link; a container mounting a data
// directory costs no read; and at validation, a mount a later plugin adds
// there gets the pod read too. Without the pod, such a container is
// refused, never created unjudged.
func TestPlantedLinkThroughPlugin(t *testing.T) {
	hostPod := func(name, hostPath string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name, UID: types.UID("uid-" + name)},
			Spec: corev1.PodSpec{
				Volumes:    []corev1.Volume{{Name: "h", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: hostPath}}}},
				Containers: []corev1.Container{{Name: "main", VolumeMounts: []corev1.VolumeMount{{Name: "h", MountPath: "/mnt/host"}}}}}}
	}
	client := fake.NewClientset(hostPod("planted", "/var/tmp/abs/containerd.sock"), hostPod("plain", "/var/tmp/plain"), hostPod("later", "/var/tmp/plain"))
	var reads atomic.Int32
	client.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) { reads.Add(1); return false, nil, nil })
	rules := &atomic.Pointer[Rules]{}
	rules.Store(testRules(t).WithHostRoot(hostRoot(t)))
	decisions, latency := NewMetrics(prometheus.NewRegistry())
	p := &Plugin{Rules: rules, Allocations: fixedAllocations{}, Exemptions: &verifier.Exemptions{Client: client},
		Log: logr.Discard(), Decisions: decisions, Latency: latency}
	create := func(pod, source string) error {
		req := createRequest(pod, "main")
		req.Container.Mounts = []*api.Mount{{Destination: "/mnt/host", Source: source, Type: "bind", Options: []string{"rbind", "rw"}}}
		_, _, err := p.CreateContainer(context.Background(), req.Pod, req.Container)
		return err
	}
	err := create("planted", "/run/containerd/containerd.sock")
	if err == nil || !strings.Contains(err.Error(), "names the host path /var/tmp/abs/containerd.sock, which the node resolves through the link /var/tmp/abs to /run/containerd/containerd.sock") {
		t.Errorf("a planted link: %v, want refused naming the name, the link and where it leads", err)
	}
	if got := reads.Swap(0); got != 1 {
		t.Errorf("a planted link: %d reads of the pod, want 1", got)
	}
	if err := create("plain", "/var/tmp/plain"); err != nil {
		t.Errorf("a data directory: %v", err)
	}
	if got := reads.Swap(0); got != 0 {
		t.Errorf("a data directory: %d reads of the pod, want none", got)
	}

	// Validation: a later plugin adds a mount of the runtime's socket
	// directory; the pod names no hostPath there, and it is the node's.
	req := createRequest("later", "main")
	if _, _, err := p.CreateContainer(context.Background(), req.Pod, req.Container); err != nil {
		t.Fatal(err)
	}
	adj := &api.ContainerAdjustment{}
	adj.AddMount(&api.Mount{Destination: "/run/plugin", Source: "/run/containerd", Type: "bind", Options: []string{"rbind", "ro"}})
	if err := p.ValidateContainerAdjustment(context.Background(), &api.ValidateContainerAdjustmentRequest{Pod: req.Pod, Container: req.Container, Adjust: adj}); err != nil {
		t.Errorf("a later plugin's mount: %v", err)
	}
	if got := reads.Swap(0); got != 1 {
		t.Errorf("a later plugin's mount: %d reads of the pod, want 1", got)
	}

	p.Exemptions = &verifier.Exemptions{}
	if err := create("planted", "/run/containerd/containerd.sock"); err == nil || !strings.Contains(err.Error(), "cannot be read") {
		t.Errorf("without the pod: %v, want refused", err)
	}
}
