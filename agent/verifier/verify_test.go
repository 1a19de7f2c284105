package verifier

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpuguard/gpuguard/agent/discovery"
	"github.com/gpuguard/gpuguard/config"
)

// testInventory: four GPUs, the last with two MIG devices.
func testInventory() *discovery.Inventory {
	inv := &discovery.Inventory{}
	for i := range 4 {
		inv.GPUs = append(inv.GPUs, discovery.GPU{Index: i, Minor: i, UUID: fmt.Sprintf("GPU-%d", i)})
	}
	inv.GPUs[3].MIGEnabled = true
	inv.GPUs[3].MIG = []discovery.MIGDevice{{ParentIndex: 3, ParentUUID: "GPU-3", Index: 0, UUID: "MIG-3a", GPUInstanceID: 1},
		{ParentIndex: 3, ParentUUID: "GPU-3", Index: 1, UUID: "MIG-3b", GPUInstanceID: 2}}
	return inv
}

// node is a fake host /proc with container roots whose /dev holds character
// devices with the NVIDIA driver's numbers. Nothing opens them (no driver
// answers to 195 here, so an open would fail with ENXIO).
type node struct {
	t        testing.TB
	procRoot string
	next     int
}

func newNode(t testing.TB) *node {
	t.Helper()
	n := &node{t: t, procRoot: t.TempDir(), next: 100}
	probe := filepath.Join(n.procRoot, "mknod-probe")
	if err := unix.Mknod(probe, unix.S_IFCHR|0o600, int(unix.Mkdev(NVIDIAMajor, 0))); err != nil {
		t.Skipf("creating device nodes needs CAP_MKNOD (run as root, as make test does): %v", err)
	}
	_ = os.Remove(probe)
	return n
}

// container makes a container root whose /dev holds the given nodes
// (path relative to /dev -> minor) and /dev/null, and returns its PID.
func (n *node) container(devs map[string]int) int {
	n.t.Helper()
	n.next++
	dev := filepath.Join(n.procRoot, strconv.Itoa(n.next), "root", "dev")
	if err := os.MkdirAll(dev, 0o755); err != nil {
		n.t.Fatal(err)
	}
	n.mknod(filepath.Join(dev, "null"), 1, 3)
	for p, minor := range devs {
		n.mknod(filepath.Join(dev, p), NVIDIAMajor, uint32(minor))
	}
	return n.next
}

func (n *node) mknod(path string, major, minor uint32) {
	n.t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		n.t.Fatal(err)
	}
	if err := unix.Mknod(path, unix.S_IFCHR|0o600, int(unix.Mkdev(major, minor))); err != nil {
		n.t.Fatal(err)
	}
}

func TestReachableGPUsMatchesNumbersNotNames(t *testing.T) {
	n := newNode(t)
	pid := n.container(map[string]int{"nvidia0": 0, "renamed": 2, "shm/hidden": 1, "a/b/c/d/e/f/g/h/i/j/deep": 3})
	table := NewDeviceTable(testInventory())
	got, err := table.ReachableGPUs(filepath.Join(n.procRoot, strconv.Itoa(pid), "root"))
	if err != nil {
		t.Fatal(err)
	}
	want := []Reached{{UUID: "GPU-0", Path: "/dev/nvidia0"}, {UUID: "GPU-1", Path: "/dev/shm/hidden"}, {UUID: "GPU-2", Path: "/dev/renamed"},
		{UUID: "GPU-3", Path: "/dev/a/b/c/d/e/f/g/h/i/j/deep"}}
	if !slices.Equal(got, want) {
		t.Errorf("reached %v, want %v", got, want)
	}
}

func TestReachableGPUsOfAGoneContainer(t *testing.T) {
	_, err := NewDeviceTable(testInventory()).ReachableGPUs(filepath.Join(t.TempDir(), "4242", "root"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("want a not-exist error for a gone container, got %v", err)
	}
}

type fakeContainers []Container

func (f fakeContainers) Running(context.Context) ([]Container, error) { return f, nil }

type fakeAllocations Allocations

func (f fakeAllocations) Allocations(context.Context) (Allocations, error) {
	return Allocations(f), nil
}

func key(ns, pod, c string) ContainerKey { return ContainerKey{ns, pod, c} }

func TestCheckComparesReachWithAllocation(t *testing.T) {
	n := newNode(t)
	inv := testInventory()
	cases := []struct {
		name   string
		key    ContainerKey
		devs   map[string]int
		alloc  map[string][]string
		want   []string // UUIDs of findings
		exempt string
	}{
		{"own GPU", key("team-a", "train", "main"), map[string]int{"nvidia1": 1}, map[string][]string{"nvidia.com/gpu": {"GPU-1"}}, nil, ""},
		{"widened", key("team-a", "widen", "main"), map[string]int{"nvidia1": 1, "nvidia2": 2}, map[string][]string{"nvidia.com/gpu": {"GPU-1"}}, []string{"GPU-2"}, ""},
		{"no allocation, every GPU", key("team-a", "leak", "main"), map[string]int{"nvidia0": 0, "nvidia1": 1, "nvidia2": 2, "nvidia3": 3}, nil, []string{"GPU-0", "GPU-1", "GPU-2", "GPU-3"}, ""},
		{"time-sliced replica", key("team-a", "shared", "main"), map[string]int{"nvidia0": 0}, map[string][]string{"nvidia.com/gpu.shared": {"GPU-0::3"}}, nil, ""},
		{"MIG device opens its parent's node", key("team-a", "mig", "main"), map[string]int{"nvidia3": 3}, map[string][]string{"nvidia.com/mig-1g.10gb": {"MIG-3b"}}, nil, ""},
		{"index IDs", key("team-a", "index", "main"), map[string]int{"nvidia2": 2}, map[string][]string{"nvidia.com/gpu": {"2"}}, nil, ""},
		{"NVIDIA DRA claim", key("team-a", "dra", "main"), map[string]int{"nvidia1": 1}, map[string][]string{"dra:gpu.nvidia.com": {"gpu-1"}}, nil, ""},
		{"a resource the policy does not know grants nothing", key("team-a", "other", "main"), map[string]int{"nvidia0": 0}, map[string][]string{"example.com/gpu": {"GPU-0"}}, []string{"GPU-0"}, ""},
		{"exempt namespace", key("gpu-operator", "dcgm", "exporter"), map[string]int{"nvidia0": 0}, nil, []string{"GPU-0"}, "namespace gpu-operator"},
		{"no GPU node at all", key("team-a", "web", "main"), nil, nil, nil, ""},
	}
	var containers fakeContainers
	allocs := fakeAllocations{}
	for i, c := range cases {
		containers = append(containers, Container{ID: fmt.Sprintf("c%d", i), Key: c.key, PID: n.container(c.devs)})
		allocs[c.key] = c.alloc
	}
	self := key("gpuguard", "agent-x", "agent")
	containers = append(containers, Container{ID: "self", Key: self, PID: n.container(map[string]int{"nvidia0": 0})},
		Container{ID: "gone", Key: key("team-a", "gone", "main"), PID: 99999})
	pol := config.Default()
	v := &Verifier{Containers: containers, Allocations: allocs, Table: NewDeviceTable(inv), Resolver: NewGPUResolver(inv),
		IsGPUResource: pol.Spec.IsGPUResource, ProcRoot: n.procRoot, Self: self,
		Exempt: (&Exemptions{Namespaces: []string{"gpu-operator"}}).OfGPUs}
	p, err := v.Check(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if p.Containers != len(containers) || p.Skipped != 1 {
		t.Errorf("looked at %d containers, skipped %d; want %d and 1 (the gone one)", p.Containers, p.Skipped, len(containers))
	}
	for _, c := range cases {
		var got []string
		for _, f := range p.Findings {
			if f.Container.Key == c.key {
				got = append(got, f.GPU.UUID)
				if f.Exempt != c.exempt {
					t.Errorf("%s: exempt %q, want %q", c.name, f.Exempt, c.exempt)
				}
			}
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: findings %v, want %v", c.name, got, c.want)
		}
	}
	for _, f := range p.Findings {
		if f.Container.Key == self {
			t.Errorf("the agent's own pod was judged: %+v", f)
		}
	}
}

type recordedActions struct {
	events, stops []string
}

func (r *recordedActions) Event(_ context.Context, findings []Finding) error {
	var gpus []string
	for _, f := range findings {
		gpus = append(gpus, f.GPU.UUID)
	}
	r.events = append(r.events, findings[0].Container.Key.String()+"@"+strings.Join(gpus, ","))
	return nil
}

func (r *recordedActions) Stop(_ context.Context, f Finding) error {
	r.stops = append(r.stops, f.Container.Key.String())
	return nil
}

func TestReporter(t *testing.T) {
	leak := Container{ID: "c1", PodUID: "u1", Key: key("team-a", "leak", "main")}
	operator := Container{ID: "c2", PodUID: "u2", Key: key("gpu-operator", "dcgm", "exporter")}
	pass := Pass{Containers: 3, Findings: []Finding{
		{Container: leak, GPU: Reached{UUID: "GPU-0", Path: "/dev/nvidia0"}, SeenBy: "device-node"},
		{Container: leak, GPU: Reached{UUID: "GPU-1", Path: "/dev/nvidia1"}, SeenBy: "device-node"},
		{Container: operator, GPU: Reached{UUID: "GPU-0", Path: "/dev/nvidia0"}, SeenBy: "device-node", Exempt: "namespace gpu-operator"},
	}}
	for _, mode := range []string{ModeReport, ModeEnforce} {
		t.Run(mode, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			acts := &recordedActions{}
			r := &Reporter{Mode: mode, Log: logr.Discard(), Metrics: NewMetrics(reg), Actions: acts}
			r.Report(context.Background(), pass, nil)
			r.Report(context.Background(), pass, nil)
			if got := testutil.ToFloat64(r.Metrics.Unallocated.WithLabelValues("team-a", "leak", "main")); got != 2 {
				t.Errorf("metric for the leaking container = %v, want 2", got)
			}
			if n := testutil.CollectAndCount(r.Metrics.Unallocated); n != 1 {
				t.Errorf("%d finding series, want 1 (exempt pods are not counted)", n)
			}
			if want := []string{"team-a/leak/main@GPU-0,GPU-1"}; !slices.Equal(acts.events, want) {
				t.Errorf("events %v, want %v: one per container for its new findings, none for the exempt pod", acts.events, want)
			}
			var wantStops []string
			if mode == ModeEnforce {
				// Once a pass while the finding stands (a container the
				// kubelet restarts is stopped again), once for its two GPUs.
				wantStops = []string{leak.Key.String(), leak.Key.String()}
			}
			if !slices.Equal(acts.stops, wantStops) {
				t.Errorf("stops %v, want %v", acts.stops, wantStops)
			}
			r.Report(context.Background(), Pass{Containers: 2}, nil)
			if n := testutil.CollectAndCount(r.Metrics.Unallocated); n != 0 {
				t.Errorf("%d finding series after the pod is gone, want 0", n)
			}
		})
	}
}

func TestReporterCountsFailedPasses(t *testing.T) {
	r := &Reporter{Mode: ModeReport, Log: logr.Discard(), Metrics: NewMetrics(prometheus.NewRegistry())}
	r.Report(context.Background(), Pass{}, errors.New("no CRI socket"))
	r.Report(context.Background(), Pass{}, errors.New("no CRI socket"))
	if got := testutil.ToFloat64(r.Metrics.Passes.WithLabelValues("error")); got != 2 {
		t.Errorf("failed passes = %v, want 2", got)
	}
}

// TestExemptFindingsAreCounted: what exemptions let through is counted by
// exemption, apart from the findings.
func TestExemptFindingsAreCounted(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	gpu := func(pod, uuid, exempt string) Finding {
		return Finding{Container: Container{Key: key("gpu-infra", pod, "main")}, GPU: Reached{UUID: uuid}, Exempt: exempt}
	}
	m.setFindings([]Finding{gpu("dcgm", "GPU-0", "service account gpu-infra/dcgm"), gpu("dcgm", "GPU-1", "service account gpu-infra/dcgm"),
		gpu("train", "GPU-2", "KAI Scheduler fraction (1 GPU)"), gpu("leak", "GPU-3", "")})
	for exemption, want := range map[string]float64{"service account gpu-infra/dcgm": 2, "KAI Scheduler fraction": 1} {
		if got := testutil.ToFloat64(m.Exempt.WithLabelValues(exemption)); got != want {
			t.Errorf("exempt access by %q = %v, want %v", exemption, got, want)
		}
	}
	if got := testutil.ToFloat64(m.Unallocated.WithLabelValues("gpu-infra", "leak", "main")); got != 1 {
		t.Errorf("unexempt finding = %v, want 1", got)
	}
	if n := testutil.CollectAndCount(m.Unallocated); n != 1 {
		t.Errorf("%d finding series, want the unexempt one alone", n)
	}
}

func TestFindingSeriesAreBounded(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	var findings []Finding
	for i := range maxFindingSeries + 50 {
		findings = append(findings, Finding{Container: Container{Key: key("ns", fmt.Sprintf("pod-%d", i), "main")}, GPU: Reached{UUID: "GPU-0"}})
	}
	m.setFindings(findings)
	if n := testutil.CollectAndCount(m.Unallocated); n != maxFindingSeries+1 {
		t.Errorf("%d series, want %d and one overflow series", n, maxFindingSeries+1)
	}
	if got := testutil.ToFloat64(m.Unallocated.WithLabelValues(overflowLabel, overflowLabel, overflowLabel)); got != 50 {
		t.Errorf("overflow series = %v, want 50", got)
	}
}

func TestPIDFromInfo(t *testing.T) {
	for _, c := range []struct {
		info map[string]string
		pid  int
		ok   bool
	}{
		{map[string]string{"info": `{"pid": 4242, "sandboxID": "x"}`}, 4242, true},
		{map[string]string{"info": `{"sandboxID": "x"}`}, 0, false},
		{map[string]string{"info": `not json`}, 0, false},
		{map[string]string{}, 0, false},
	} {
		pid, err := pidFromInfo(c.info)
		if (err == nil) != c.ok || pid != c.pid {
			t.Errorf("pidFromInfo(%v) = %d, %v; want %d, ok=%v", c.info, pid, err, c.pid, c.ok)
		}
	}
}

// TestAFloodedDevIsReportedNotSkipped: a container that fills its /dev past
// what a pass walks is a finding (not verifiable), never passed over: an
// Event, and in enforce mode stopped.
func TestAFloodedDevIsReportedNotSkipped(t *testing.T) {
	n := newNode(t)
	pid := n.container(map[string]int{"nvidia1": 1})
	dev := filepath.Join(n.procRoot, strconv.Itoa(pid), "root", "dev", "flood")
	if err := os.MkdirAll(dev, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range devWalkEntries {
		if err := os.WriteFile(filepath.Join(dev, strconv.Itoa(i)), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	inv := testInventory()
	c := Container{ID: "flood", Key: key("team-a", "flood", "main"), PID: pid}
	v := &Verifier{Containers: fakeContainers{c}, Allocations: fakeAllocations{}, Table: NewDeviceTable(inv),
		Resolver: NewGPUResolver(inv), IsGPUResource: config.Default().Spec.IsGPUResource, ProcRoot: n.procRoot}
	p, err := v.Check(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Unverifiable) != 1 || p.Unverifiable[0].ID != "flood" {
		t.Errorf("unverifiable %+v, want the flooded container", p.Unverifiable)
	}
	if len(p.Findings) != 1 || p.Findings[0].SeenBy != SeenByUnverifiable || p.Findings[0].Container.ID != "flood" {
		t.Fatalf("findings %+v, want one unverifiable finding for the flooded container", p.Findings)
	}
	// A finding like any other: an Event, and in enforce mode a stop.
	acts := &recordedActions{}
	r := &Reporter{Mode: ModeEnforce, Log: logr.Discard(), Metrics: NewMetrics(prometheus.NewRegistry()), Actions: acts}
	r.Report(context.Background(), p, nil)
	if got := testutil.ToFloat64(r.Metrics.Unverified.WithLabelValues("dev-too-large")); got != 1 {
		t.Errorf("unverified metric %v, want 1", got)
	}
	if len(acts.events) != 1 || !slices.Equal(acts.stops, []string{c.Key.String()}) {
		t.Errorf("events %v, stops %v; want one Event and one stop of %s", acts.events, acts.stops, c.Key)
	}
	if !strings.Contains(Message(p.Findings), "cannot be verified") {
		t.Errorf("event message %q", Message(p.Findings))
	}
}

// TestKAIFractionsAreNotReported: with the policy's KAI integration on, the
// fraction container of a pod KAI scheduled may reach as many GPUs as its
// fraction spans without an allocation (an info-level, exempt finding); one
// that reaches more, another container of the pod, or any of them with the
// integration off, is reported.
func TestKAIFractionsAreNotReported(t *testing.T) {
	n := newNode(t)
	inv := testInventory()
	kaiPod := func(name, uid string, ann map[string]string) *corev1.Pod {
		a := map[string]string{"gpu-fraction": "0.5", "runai/shared-gpu-configmap": name + "-abc1234-shared-gpu"}
		maps.Copy(a, ann)
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name, UID: types.UID(uid), Annotations: a},
			Spec: corev1.PodSpec{SchedulerName: "kai-scheduler", Containers: []corev1.Container{{Name: "main"}, {Name: "side"}}}}
	}
	client := fake.NewClientset(kaiPod("frac", "u1", nil), kaiPod("wide", "u2", nil),
		kaiPod("two", "u3", map[string]string{"gpu-fraction-num-devices": "2"}))
	containers := fakeContainers{
		{ID: "a", PodUID: "u1", Key: key("team-a", "frac", "main"), PID: n.container(map[string]int{"nvidia2": 2})},
		{ID: "b", PodUID: "u1", Key: key("team-a", "frac", "side"), PID: n.container(map[string]int{"nvidia2": 2})},
		{ID: "c", PodUID: "u2", Key: key("team-a", "wide", "main"), PID: n.container(map[string]int{"nvidia1": 1, "nvidia2": 2})},
		{ID: "d", PodUID: "u3", Key: key("team-a", "two", "main"), PID: n.container(map[string]int{"nvidia1": 1, "nvidia2": 2})},
	}
	for _, on := range []bool{true, false} {
		p := config.Default()
		p.Spec.Integrations.KAIScheduler = config.KAIScheduler{Fractions: on, SchedulerNames: []string{"kai-scheduler"}}
		ex := &Exemptions{Client: client}
		ex.Set(p, nil)
		v := &Verifier{Containers: containers, Allocations: fakeAllocations{}, Table: NewDeviceTable(inv), Resolver: NewGPUResolver(inv),
			IsGPUResource: p.Spec.IsGPUResource, ProcRoot: n.procRoot, Exempt: ex.OfGPUs, Fraction: ex.KAIFraction}
		pass, err := v.Check(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		exempt := map[string][]bool{}
		for _, f := range pass.Findings {
			exempt[f.Container.Key.String()] = append(exempt[f.Container.Key.String()], f.Exempt != "")
		}
		want := map[string][]bool{"team-a/frac/main": {on}, "team-a/frac/side": {false},
			"team-a/wide/main": {false, false}, "team-a/two/main": {on, on}}
		if !maps.EqualFunc(exempt, want, slices.Equal) {
			t.Errorf("integration on=%v: findings exempt %v, want %v", on, exempt, want)
		}
	}
}

// TestUnknownIDSchemesAreReportOnly: a container whose allocation names
// devices by a scheme the resolver does not know (a sharing scheduler's
// "<uuid>-_-<n>") is reported, but never stopped in enforce mode: what it
// was given is unknown, and stopping it would evict legitimate pods in a
// loop. A container with a known allocation that widens it is still
// stopped.
func TestUnknownIDSchemesAreReportOnly(t *testing.T) {
	n := newNode(t)
	inv := testInventory()
	shared := Container{ID: "shared", Key: key("team-a", "shared", "main"), PID: n.container(map[string]int{"nvidia1": 1})}
	widen := Container{ID: "widen", Key: key("team-a", "widen", "main"), PID: n.container(map[string]int{"nvidia1": 1, "nvidia2": 2})}
	allocs := fakeAllocations{
		shared.Key: {"aliyun.com/gpu-mem": {"GPU-1-_-0", "GPU-1-_-1"}},
		widen.Key:  {"nvidia.com/gpu": {"GPU-1"}},
	}
	pol := config.Default()
	pol.Spec.GPUResources = append(pol.Spec.GPUResources, "aliyun.com/gpu-mem")
	v := &Verifier{Containers: fakeContainers{shared, widen}, Allocations: allocs, Table: NewDeviceTable(inv), Resolver: NewGPUResolver(inv),
		IsGPUResource: pol.Spec.IsGPUResource, ProcRoot: n.procRoot}
	p, err := v.Check(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range p.Findings {
		if (f.Container.ID == "shared") != (f.ReportOnly != "") {
			t.Errorf("%s reaching %s: reportOnly %q", f.Container.ID, f.GPU.UUID, f.ReportOnly)
		}
	}
	acts := &recordedActions{}
	r := &Reporter{Mode: ModeEnforce, Log: logr.Discard(), Metrics: NewMetrics(prometheus.NewRegistry()), Actions: acts}
	r.Report(context.Background(), p, nil)
	if !slices.Equal(acts.stops, []string{widen.Key.String()}) {
		t.Errorf("stops %v, want only %s", acts.stops, widen.Key)
	}
	if len(acts.events) != 2 {
		t.Errorf("events %v, want one for each container: a report-only finding is still reported", acts.events)
	}
}

// TestInitContainersJudgedByTheCheckpoint: an init container, which
// PodResources leaves out, is judged by what the kubelet's checkpoint
// records for it: its own GPU is no finding, a neighbour's is.
func TestInitContainersJudgedByTheCheckpoint(t *testing.T) {
	n := newNode(t)
	inv := testInventory()
	dir := t.TempDir()
	cp := `{"Data":{"PodDeviceEntries":[{"PodUID":"uid-train","ContainerName":"warm-up","ResourceName":"nvidia.com/gpu","DeviceIDs":{"0":["GPU-1"]}}]},"Checksum":1}`
	if err := os.WriteFile(filepath.Join(dir, CheckpointFile), []byte(cp), 0o600); err != nil {
		t.Fatal(err)
	}
	warmUp := Container{ID: "init", Key: key("team-a", "train", "warm-up"), PodUID: "uid-train", PID: n.container(map[string]int{"nvidia1": 1, "nvidia2": 2})}
	for _, tc := range []struct {
		name       string
		checkpoint *Checkpoint
		want       []string
	}{
		{"with the checkpoint, the neighbour's GPU only", NewCheckpoint(dir), []string{"GPU-2"}},
		{"without, its own GPU too", nil, []string{"GPU-1", "GPU-2"}},
	} {
		v := &Verifier{Containers: fakeContainers{warmUp}, Allocations: fakeAllocations{}, Table: NewDeviceTable(inv), Resolver: NewGPUResolver(inv),
			IsGPUResource: config.Default().Spec.IsGPUResource, ProcRoot: n.procRoot, Checkpoint: tc.checkpoint}
		p, err := v.Check(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, f := range p.Findings {
			got = append(got, f.GPU.UUID)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: findings %v, want %v", tc.name, got, tc.want)
		}
	}
}
