package enforcer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuguard/gpuguard/agent/verifier"
	"github.com/gpuguard/gpuguard/internal/wellknown"
)

// DefaultSocket is where containerd and CRI-O serve NRI.
const DefaultSocket = "/var/run/nri/nri.sock"

// PluginName and PluginIndex name the plugin to the runtime; the index
// orders it among NRI plugins: late, so that it judges what device
// injectors before it added.
const (
	PluginName  = "gpuguard"
	PluginIndex = "90"
)

// Plugin is the enforcer as an NRI plugin.
type Plugin struct {
	// Rules are the policy in force on this node's GPUs.
	Rules *atomic.Pointer[Rules]
	// Allocations reads the kubelet's allocations.
	Allocations verifier.AllocationSource
	// Checkpoint, when set, gives the devices of containers PodResources
	// leaves out (init containers).
	Checkpoint *verifier.Checkpoint
	// Exemptions are the policy's, as the verifier applies them.
	Exemptions *verifier.Exemptions
	// Client records Events on pods whose containers were changed or
	// refused; nil records none.
	Client kubernetes.Interface
	Node   string
	// Lease, when set, is held while the enforcer is registered.
	Lease *Lease
	Log   logr.Logger
	// Decisions counts containers by result: unchanged, adjusted,
	// refused, exempt, error.
	Decisions *prometheus.CounterVec
	// Latency observes the time one decision takes.
	Latency prometheus.Observer
	// Reads, when set, counts the reads of the kubelet's allocations by
	// when they were made: sandbox (as the pod's sandbox started) or
	// creation (at a container's creation, finding none fresh).
	Reads *prometheus.CounterVec

	// Validations counts adjustment validations by result: accepted,
	// rejected, error; ValidationLatency observes their time. Either may
	// be nil.
	Validations       *prometheus.CounterVec
	ValidationLatency prometheus.Observer

	// reads keeps pods' allocations for their containers' creations.
	reads podReads
	// judged keeps what a container's creation read for its validation.
	judged judgements
}

// decisionBuckets run from 0.1 ms to about 1.2 s, past the decision's
// budget, in steps of √2: fine enough to tell a decision's tail against
// the 2 ms a container creation may gain from it.
var decisionBuckets = prometheus.ExponentialBuckets(0.0001, math.Sqrt2, 28)

// NewReadMetrics registers the count of the enforcer's reads of the
// kubelet's allocations (Plugin.Reads).
func NewReadMetrics(reg prometheus.Registerer) *prometheus.CounterVec {
	reads := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpuguard_agent_enforcer_kubelet_reads_total",
		Help: "Reads of the kubelet's allocations by the node enforcer, by when: sandbox (as a pod's sandbox started), creation (at a container's creation)."}, []string{"at"})
	reg.MustRegister(reads)
	return reads
}

// countRead counts one read of the kubelet's allocations.
func (p *Plugin) countRead(at string) {
	if p.Reads != nil {
		p.Reads.WithLabelValues(at).Inc()
	}
}

// NewMetrics registers the enforcer's metrics.
func NewMetrics(reg prometheus.Registerer) (*prometheus.CounterVec, prometheus.Histogram) {
	decisions := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpuguard_agent_enforcer_decisions_total",
		Help: "Containers the node enforcer judged at creation, by result: unchanged, adjusted, refused, exempt, error."}, []string{"result"})
	latency := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "gpuguard_agent_enforcer_decision_seconds",
		Help: "Time the node enforcer takes to judge one container at creation.", Buckets: decisionBuckets})
	reg.MustRegister(decisions, latency)
	return decisions, latency
}

// Run serves the runtime on socket until ctx ends, connecting again
// after the runtime restarts.
func (p *Plugin) Run(ctx context.Context, socket string, retry time.Duration) {
	for ctx.Err() == nil {
		err := p.serve(ctx, socket)
		if ctx.Err() != nil {
			return
		}
		p.Log.Info("NRI connection ended; connecting again", "socket", socket, "reason", fmt.Sprint(err), "retryIn", retry.String())
		select {
		case <-ctx.Done():
		case <-time.After(retry):
		}
	}
}

func (p *Plugin) serve(ctx context.Context, socket string) error {
	s, err := stub.New(p, stub.WithPluginName(PluginName), stub.WithPluginIdx(PluginIndex), stub.WithSocketPath(socket),
		stub.WithOnClose(func() {}), stub.WithLogger(nriLog{p.Log.WithName("nri")}))
	if err != nil {
		return err
	}
	if err := s.Start(ctx); err != nil {
		return fmt.Errorf("registering with the runtime's NRI at %s: %w", socket, err)
	}
	p.Log.Info("node enforcer registered with the runtime's NRI", "socket", socket)
	held, release := context.WithCancel(ctx)
	defer release()
	if p.Lease != nil {
		go p.Lease.Hold(held)
	}
	closed := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			s.Stop()
		case <-closed:
		}
	}()
	s.Wait()
	close(closed)
	return errors.New("the runtime closed the NRI connection")
}

// RunPodSandbox starts reading the pod's allocations, off the sandbox's
// path, for its containers' creations: the kubelet creates them once the
// sandbox runs, and they then find the read done.
func (p *Plugin) RunPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.reads.start(pod.GetUid(), func(ctx context.Context) (verifier.Allocations, error) {
		p.countRead("sandbox")
		return p.read(ctx, pod)
	})
	return nil
}

// RemovePodSandbox forgets the pod's allocations.
func (p *Plugin) RemovePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.reads.forget(pod.GetUid())
	return nil
}

// CreateContainer judges one container as the runtime creates it.
func (p *Plugin) CreateContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	start := time.Now()
	result, adj, err := p.decide(ctx, pod, ctr)
	p.Decisions.WithLabelValues(result).Inc()
	p.Latency.Observe(time.Since(start).Seconds())
	return adj, nil, err
}

// decisionBudget bounds the reads one decision makes (the kubelet's
// allocations, a pod for its service account): under NRI's 2 s request
// timeout, so that a slow kubelet gets this container refused, with a
// reason, rather than the plugin timed out, which NRI answers by dropping
// its connection and creating containers without it until it reconnects.
const decisionBudget = 1500 * time.Millisecond

// ReconnectInterval is how long the enforcer waits before connecting to
// the runtime again after a lost connection.
const ReconnectInterval = 5 * time.Second

func (p *Plugin) decide(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) (string, *api.ContainerAdjustment, error) {
	ctx, cancel := context.WithTimeout(ctx, decisionBudget)
	defer cancel()
	key := verifier.ContainerKey{Namespace: pod.GetNamespace(), Pod: pod.GetName(), Container: ctr.GetName()}
	log := p.Log.WithValues("container", key.String())
	rules := p.Rules.Load()
	spec := containerOf(ctr)
	spec.Name, spec.PodAnnotations = ctr.GetName(), pod.GetAnnotations()
	// Most containers, whose images say nothing of GPUs, need neither the
	// kubelet nor the exemptions: they cost no read.
	if !rules.NeedsAllocation(spec) {
		return "unchanged", nil, nil
	}
	facts, err := p.allocated(ctx, pod, ctr, rules)
	if err != nil {
		// Fail closed: without the allocation nothing says what the
		// container may have; the kubelet retries the creation.
		log.Error(err, "refused: the kubelet's allocation cannot be read")
		// Not err itself: a deadline error would read to NRI as the plugin
		// timing out, and close it.
		return "error", nil, fmt.Errorf("gpuguard: cannot read the kubelet's GPU allocation for %s: %s", key, err.Error())
	}
	// Exemptions and KAI's fractions only leave alone what the decision
	// would change: a container that keeps its spec without them (a GPU
	// container within its allocation) keeps it with them, and needs no
	// read of its pod from the API server.
	d := rules.Decide(spec, facts)
	if !d.Changed() {
		p.judged.put(ctr.GetId(), facts, false)
		log.V(1).Info("unchanged", "allocated", facts.Allocated, "claimed", facts.Claimed)
		return "unchanged", nil, nil
	}
	exempt := p.relax(ctx, pod, ctr, &facts)
	p.judged.put(ctr.GetId(), facts, true)
	if exempt {
		log.V(1).Info("exempt", "exemption", facts.Exempt)
		return "exempt", nil, nil
	}
	if facts.Exempt != "" || facts.KAIFraction {
		// Decided again with what relaxes it.
		d = rules.Decide(spec, facts)
	}
	switch {
	case d.Refuse != "":
		log.Info("refused", "reason", d.Refuse)
		go p.event(context.WithoutCancel(ctx), pod, ctr, corev1.EventTypeWarning, wellknown.ReasonContainerRefused, d.Refuse)
		return "refused", nil, errors.New(d.Refuse)
	case !d.Changed():
		log.V(1).Info("unchanged", "allocated", facts.Allocated, "claimed", facts.Claimed)
		return "unchanged", nil, nil
	}
	log.Info("adjusted to the allocation", "allocated", facts.Allocated, "claimed", facts.Claimed, "kaiBound", facts.KAIBound, "changes", d.Changes)
	go p.event(context.WithoutCancel(ctx), pod, ctr, corev1.EventTypeNormal, wellknown.ReasonContainerAdjusted,
		"gpuguard made the container grant only its allocation: "+strings.Join(d.Changes, "; "))
	return "adjusted", adjustment(d), nil
}

// allocated are the facts of the kubelet's allocation to ctr: the GPU
// devices PodResources, or the device checkpoint for a container it leaves
// out, names for it.
func (p *Plugin) allocated(ctx context.Context, pod *api.PodSandbox, ctr *api.Container, rules *Rules) (Facts, error) {
	allocations, err := p.allocations(ctx, pod)
	if err != nil {
		return Facts{}, err
	}
	facts := Facts{}
	key := verifier.ContainerKey{Namespace: pod.GetNamespace(), Pod: pod.GetName(), Container: ctr.GetName()}
	allocated, ok := allocations[key]
	if !ok && p.Checkpoint != nil {
		if allocated, _, err = p.Checkpoint.Container(pod.GetUid(), ctr.GetName()); err != nil {
			return Facts{}, err
		}
	}
	for resource, ids := range allocated {
		if driver, ok := strings.CutPrefix(resource, verifier.DRAResourcePrefix); ok {
			for _, id := range ids {
				facts.Claimed = append(facts.Claimed, ClaimedDevice{Driver: driver, Device: id})
			}
			continue
		}
		if _, ok := strings.CutPrefix(resource, verifier.DRACDIResourcePrefix); ok {
			facts.ClaimedCDI = append(facts.ClaimedCDI, ids...)
			continue
		}
		if rules.policy.IsGPUResource(resource) {
			facts.Allocated = append(facts.Allocated, ids...)
		}
	}
	return facts, nil
}

// relax adds to f what relaxes the decision: the pod's exemption, with
// the rules it waives, and KAI's fraction. It reports whether the
// exemption waives every rule.
func (p *Plugin) relax(ctx context.Context, pod *api.PodSandbox, ctr *api.Container, f *Facts) (exempt bool) {
	key := verifier.ContainerKey{Namespace: pod.GetNamespace(), Pod: pod.GetName(), Container: ctr.GetName()}
	c := verifier.Container{ID: ctr.GetId(), Key: key, PodUID: pod.GetUid()}
	f.KAIFraction = p.Exemptions.KAIFraction(ctx, c) > 0
	if f.KAIFraction {
		f.KAIBound, f.KAIUnbound = p.kaiBound(ctx, c)
	}
	f.Exempt, f.Waived = p.Exemptions.Of(ctx, c)
	return f.Exempt != "" && f.Waived == nil
}

// allocations are the kubelet's allocations to the pod: those read when
// its sandbox started or at an earlier container's creation, where fresh,
// else read now. A fresh read serves the containers it does not name too:
// PodResources names the containers of the pod's spec, which cannot gain
// one, and those it leaves out (init containers that are not sidecars, a
// debug container, a container another CRI client put in the sandbox)
// would be left out of a new read as well; decide looks them up in the
// device checkpoint, by the pod's UID.
func (p *Plugin) allocations(ctx context.Context, pod *api.PodSandbox) (verifier.Allocations, error) {
	if allocs, ok := p.reads.get(ctx, pod.GetUid()); ok {
		return allocs, nil
	}
	started := time.Now()
	p.countRead("creation")
	allocs, err := p.read(ctx, pod)
	if err == nil {
		p.reads.put(pod.GetUid(), started, allocs)
	}
	return allocs, err
}

// read reads the kubelet's allocations to the pod: with one Get where the
// source can, else a List of every pod's.
func (p *Plugin) read(ctx context.Context, pod *api.PodSandbox) (verifier.Allocations, error) {
	if one, ok := p.Allocations.(verifier.PodAllocationSource); ok {
		return one.PodAllocations(ctx, pod.GetNamespace(), pod.GetName())
	}
	return p.Allocations.Allocations(ctx)
}

// containerOf is what Decide reads of an NRI container.
func containerOf(ctr *api.Container) Container {
	c := Container{Env: ctr.GetEnv(), Annotations: ctr.GetAnnotations()}
	for _, m := range ctr.GetMounts() {
		c.Mounts = append(c.Mounts, Mount{Destination: m.GetDestination(), Source: m.GetSource()})
	}
	for _, d := range ctr.GetLinux().GetDevices() {
		c.Devices = append(c.Devices, Device{Path: d.GetPath(), Type: d.GetType(), Major: d.GetMajor(), Minor: d.GetMinor()})
	}
	for _, rule := range ctr.GetLinux().GetResources().GetDevices() {
		if rule.GetAllow() && (rule.GetType() == "" || rule.GetType() == "a") && rule.GetMajor() == nil && rule.GetMinor() == nil {
			c.AllDevices = true
		}
		c.DeviceRules = append(c.DeviceRules, DeviceRule{Allow: rule.GetAllow(), Type: rule.GetType(),
			Major: rule.GetMajor().Get(), Minor: rule.GetMinor().Get(), Access: rule.GetAccess()})
	}
	return c
}

// adjustment is d in NRI's terms.
func adjustment(d Decision) *api.ContainerAdjustment {
	adj := &api.ContainerAdjustment{}
	for k, v := range d.SetEnv {
		adj.AddEnv(k, v)
	}
	for _, m := range d.RemoveMounts {
		adj.RemoveMount(m)
	}
	for _, a := range d.RemoveAnnotations {
		adj.RemoveAnnotation(a)
	}
	for _, name := range d.InjectCDI {
		adj.AddCDIDevice(&api.CDIDevice{Name: name})
	}
	return adj
}

// event records what the enforcer did to a pod's container, best effort
// and off the creation's path: the decision stands whether or not the
// Event is written.
func (p *Plugin) event(ctx context.Context, pod *api.PodSandbox, ctr *api.Container, kind, reason, msg string) {
	if p.Client == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	now := metav1.NewTime(time.Now())
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{GenerateName: pod.GetName() + ".", Namespace: pod.GetNamespace()},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: pod.GetNamespace(), Name: pod.GetName(),
			UID: types.UID(pod.GetUid()), FieldPath: fmt.Sprintf("spec.containers{%s}", ctr.GetName())},
		Reason: reason, Message: msg, Type: kind,
		Source:         corev1.EventSource{Component: wellknown.Agent, Host: p.Node},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
		ReportingController: wellknown.AgentReportingController, ReportingInstance: p.Node,
	}
	if _, err := p.Client.CoreV1().Events(pod.GetNamespace()).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		p.Log.V(1).Info("no Event recorded", "reason", err.Error())
	}
}

// nriLog routes the NRI library's log lines through the agent's logger,
// at debug level but for errors: the library logs every connection.
type nriLog struct{ log logr.Logger }

func (l nriLog) Debugf(_ context.Context, format string, args ...any) {
	l.log.V(1).Info(fmt.Sprintf(format, args...))
}
func (l nriLog) Infof(_ context.Context, format string, args ...any) {
	l.log.V(1).Info(fmt.Sprintf(format, args...))
}
func (l nriLog) Warnf(_ context.Context, format string, args ...any) {
	l.log.Info(fmt.Sprintf(format, args...))
}
func (l nriLog) Errorf(_ context.Context, format string, args ...any) {
	l.log.Error(nil, fmt.Sprintf(format, args...))
}
