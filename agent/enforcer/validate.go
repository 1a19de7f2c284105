package enforcer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/nri/pkg/api"
	nrigen "github.com/containerd/nri/pkg/runtime-tools/generate"
	rspec "github.com/opencontainers/runtime-spec/specs-go"
	rgen "github.com/opencontainers/runtime-tools/generate"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuguard/gpuguard/agent/verifier"
	"github.com/gpuguard/gpuguard/internal/wellknown"
)

// The enforcer sees a container at CreateContainer as the plugins before it
// left it, less the CDI devices they asked for, and nothing of what the
// plugins after it (a higher index) add; and no plugin can undo another's
// adjustment. NRI's adjustment validation (v0.11) closes that: once every
// plugin has answered, the runtime shows each validator the container as it
// came and the adjustment merged from all of them, CDI devices included, and
// refuses the container if one rejects it. The enforcer builds from the two
// the spec the runtime would run, as containerd builds it (NRI's spec
// generator, the CDI devices resolved against the node's specs), and judges
// that spec as it judges a container at its creation, with the facts that
// creation read: a container whose final spec grants beyond the kubelet's
// allocation is rejected.

// CDIInjector applies CDI devices to a spec as the runtime would.
type CDIInjector interface {
	// Inject applies the edits of the named devices, and of their specs, to
	// spec: variables, device nodes with their numbers (read from the
	// host where the spec leaves them out) and cgroup rules, mounts. A
	// device no spec of the node defines is an error.
	Inject(spec *rspec.Spec, devices []string) error
}

// WithCDIInjector resolves the CDI devices plugins ask for through inj.
func (r *Rules) WithCDIInjector(inj CDIInjector) *Rules {
	if inj != nil {
		r.inject = inj
	}
	return r
}

// FinalContainer is the container the runtime would run: ctr as it came to
// NRI, with adj, the adjustment merged from every plugin, applied as
// containerd applies it. An error says what cannot be resolved (a CDI
// device no spec of the node defines).
func (r *Rules) FinalContainer(ctr *api.Container, adj *api.ContainerAdjustment) (Container, error) {
	spec := specOf(ctr)
	if adj == nil {
		return viewOf(spec), nil
	}
	var injectErr error
	inject := func(s *rspec.Spec, names []string) error {
		if r.inject == nil {
			injectErr = fmt.Errorf("CDI devices %s: this node enforcer reads no CDI spec directory to resolve them", strings.Join(names, ","))
			return injectErr
		}
		if err := r.inject.Inject(s, names); err != nil {
			injectErr = err
			return err
		}
		return nil
	}
	g := nrigen.SpecGenerator(&rgen.Generator{Config: spec}, nrigen.WithCDIDeviceInjector(inject))
	// What grants a device, in containerd's order (Generator.Adjust); the
	// rest (hooks, resources but device rules, namespaces) grants none.
	if err := g.AdjustAnnotations(adj.GetAnnotations()); err != nil {
		return Container{}, err
	}
	g.AdjustEnv(adj.GetEnv())
	if err := g.InjectCDIDevices(adj.GetCDIDevices()); err != nil {
		if injectErr != nil {
			return Container{}, injectErr
		}
		return Container{}, err
	}
	g.AdjustDevices(adj.GetLinux().GetDevices())
	if rules := adj.GetLinux().GetResources().GetDevices(); len(rules) > 0 {
		if err := g.AdjustResources(&api.LinuxResources{Devices: rules}); err != nil {
			return Container{}, err
		}
	}
	for _, m := range adj.GetMounts() {
		dest, removed := m.IsMarkedForRemoval()
		g.RemoveMount(dest)
		if !removed {
			g.AddMount(m.ToOCI(nil))
		}
	}
	return viewOf(spec), nil
}

// specOf is the part of the OCI spec NRI shows of ctr that can grant a
// device.
func specOf(ctr *api.Container) *rspec.Spec {
	spec := &rspec.Spec{Process: &rspec.Process{Env: slices.Clone(ctr.GetEnv())}, Linux: &rspec.Linux{},
		Annotations: maps.Clone(ctr.GetAnnotations())}
	for _, m := range ctr.GetMounts() {
		spec.Mounts = append(spec.Mounts, m.ToOCI(nil))
	}
	for _, d := range ctr.GetLinux().GetDevices() {
		spec.Linux.Devices = append(spec.Linux.Devices, d.ToOCI())
	}
	if rules := ctr.GetLinux().GetResources().GetDevices(); len(rules) > 0 {
		spec.Linux.Resources = &rspec.LinuxResources{}
		for _, d := range rules {
			spec.Linux.Resources.Devices = append(spec.Linux.Resources.Devices, rspec.LinuxDeviceCgroup{Allow: d.GetAllow(),
				Type: d.GetType(), Major: d.GetMajor().Get(), Minor: d.GetMinor().Get(), Access: d.GetAccess()})
		}
	}
	return spec
}

// viewOf is what Decide reads of a final spec. Its environment is as the
// runtime reads it, each variable's last value once: nothing is left to
// change in it, only to judge.
func viewOf(spec *rspec.Spec) Container {
	c := Container{Annotations: spec.Annotations}
	if spec.Process != nil {
		values, _ := envMap(spec.Process.Env)
		seen := map[string]bool{}
		for _, kv := range spec.Process.Env {
			k, _, _ := strings.Cut(kv, "=")
			if !seen[k] {
				seen[k] = true
				c.Env = append(c.Env, k+"="+values[k])
			}
		}
	}
	for _, m := range spec.Mounts {
		c.Mounts = append(c.Mounts, Mount{Destination: m.Destination, Source: m.Source, ReadOnly: readOnly(m.Options)})
	}
	if spec.Linux == nil {
		return c
	}
	for _, d := range spec.Linux.Devices {
		c.Devices = append(c.Devices, Device{Path: d.Path, Type: d.Type, Major: d.Major, Minor: d.Minor})
	}
	if spec.Linux.Resources != nil {
		for _, rule := range spec.Linux.Resources.Devices {
			if rule.Allow && (rule.Type == "" || rule.Type == "a") && rule.Major == nil && rule.Minor == nil {
				c.AllDevices = true
			}
			c.DeviceRules = append(c.DeviceRules, DeviceRule{Allow: rule.Allow, Type: rule.Type, Major: rule.Major, Minor: rule.Minor, Access: rule.Access})
		}
	}
	return c
}

// ValidateContainerAdjustment judges the container as the runtime would run
// it, once every plugin has adjusted it: the adjustment is rejected where
// that grants beyond the kubelet's allocation.
func (p *Plugin) ValidateContainerAdjustment(ctx context.Context, req *api.ValidateContainerAdjustmentRequest) error {
	start := time.Now()
	result, err := p.validate(ctx, req)
	if p.Validations != nil {
		p.Validations.WithLabelValues(result).Inc()
	}
	if p.ValidationLatency != nil {
		p.ValidationLatency.Observe(time.Since(start).Seconds())
	}
	return err
}

func (p *Plugin) validate(ctx context.Context, req *api.ValidateContainerAdjustmentRequest) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, decisionBudget)
	defer cancel()
	pod, ctr := req.GetPod(), req.GetContainer()
	key := verifier.ContainerKey{Namespace: pod.GetNamespace(), Pod: pod.GetName(), Container: ctr.GetName()}
	log := p.Log.WithValues("container", key.String(), "at", "validation")
	judged, memo := p.judged.take(ctr.GetId())
	rules := p.Rules.Load()
	final, err := rules.FinalContainer(ctr, req.GetAdjust())
	if err != nil {
		reason := fmt.Sprintf("gpuguard: cannot tell what the container's final spec grants: %s%s", err.Error(), adjusters(req))
		log.Info("rejected", "reason", reason)
		go p.event(context.WithoutCancel(ctx), pod, ctr, corev1.EventTypeWarning, wellknown.ReasonContainerRefused, reason)
		return "rejected", errors.New(reason)
	}
	final.Name, final.PodAnnotations = ctr.GetName(), pod.GetAnnotations()
	final.PodUID, final.SandboxID = pod.GetUid(), pod.GetId()
	if !rules.NeedsAllocation(final) {
		return "accepted", nil
	}
	facts := judged.facts
	if !memo {
		// The container's creation read nothing (its spec said nothing of
		// GPUs until a later plugin's adjustment): the pod's read made at
		// its sandbox serves here too.
		if facts, err = p.allocated(ctx, pod, ctr, rules); err != nil {
			log.Error(err, "rejected: the kubelet's allocation cannot be read")
			return "error", fmt.Errorf("gpuguard: cannot read the kubelet's GPU allocation for %s: %s", key, err.Error())
		}
	}
	d := rules.Decide(final, facts)
	// A mount a later plugin added may need the pod's hostPath volumes
	// that the creation did not read.
	if d.Changed() && (!judged.relaxed || d.NeedsPod() && !facts.PodRead) {
		if p.relax(ctx, pod, ctr, &facts, d.NeedsPod()) {
			return "accepted", nil
		}
		d = rules.Decide(final, facts)
	}
	if !d.Changed() {
		return "accepted", nil
	}
	reason := d.Refuse
	if reason == "" {
		reason = "gpuguard: the container's final spec, as the runtime's NRI plugins adjusted it, grants beyond the kubelet's allocation, and no plugin can undo another's adjustment; it would take: " +
			strings.Join(d.Changes, "; ")
	}
	reason += adjusters(req)
	log.Info("rejected", "reason", reason)
	go p.event(context.WithoutCancel(ctx), pod, ctr, corev1.EventTypeWarning, wellknown.ReasonContainerRefused, reason)
	return "rejected", errors.New(reason)
}

// adjusters says, for a rejection's reason, which plugins adjusted what
// the enforcer judges (variables, device nodes, mounts, annotations), else
// which were consulted (NRI names no owner of CDI devices and cgroup rules
// here); "" where the request says neither.
func adjusters(req *api.ValidateContainerAdjustmentRequest) string {
	id, adj, owners := req.GetContainer().GetId(), req.GetAdjust(), req.GetOwners()
	names := map[string]bool{}
	add := func(owner string, ok bool) {
		if ok && owner != "" {
			names[owner] = true
		}
	}
	if owners == nil {
		owners = api.NewOwningPlugins()
	}
	for _, e := range adj.GetEnv() {
		k, _ := api.IsMarkedForRemoval(e.GetKey())
		add(owners.EnvOwner(id, k))
	}
	for _, d := range adj.GetLinux().GetDevices() {
		add(owners.DeviceOwner(id, d.GetPath()))
	}
	for _, m := range adj.GetMounts() {
		add(owners.MountOwner(id, m.GetDestination()))
	}
	for k := range adj.GetAnnotations() {
		k, _ = api.IsMarkedForRemoval(k)
		add(owners.AnnotationOwner(id, k))
	}
	if len(names) == 0 {
		var all []string
		for _, pl := range req.GetPlugins() {
			all = append(all, pl.GetIndex()+"-"+pl.GetName())
		}
		if len(all) == 0 {
			return ""
		}
		return " (NRI plugins consulted: " + strings.Join(all, ", ") + ")"
	}
	return " (adjusted by NRI plugins " + strings.Join(slices.Sorted(maps.Keys(names)), ", ") + ")"
}

// judgement is what a container's creation learnt of it, for its
// validation moments later: the facts (the allocation read), and whether
// its exemptions and KAI fraction were looked up.
type judgement struct {
	facts   Facts
	relaxed bool
	at      time.Time
}

// judgements hold creations' facts by container ID until the validation
// that follows takes them; those never taken (a container refused at
// creation, which is not validated) go once no longer fresh.
type judgements struct {
	mu   sync.Mutex
	byID map[string]judgement
}

func (j *judgements) put(id string, f Facts, relaxed bool) {
	if id == "" {
		return
	}
	now := time.Now()
	j.mu.Lock()
	defer j.mu.Unlock()
	for k, v := range j.byID {
		if now.Sub(v.at) >= readFresh {
			delete(j.byID, k)
		}
	}
	if j.byID == nil {
		j.byID = map[string]judgement{}
	}
	j.byID[id] = judgement{facts: f, relaxed: relaxed, at: now}
}

func (j *judgements) take(id string) (judgement, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	v, ok := j.byID[id]
	delete(j.byID, id)
	if ok && time.Since(v.at) >= readFresh {
		return judgement{}, false
	}
	return v, ok
}

// NewValidationMetrics registers the count and time of the enforcer's
// adjustment validations (Plugin.Validations, Plugin.ValidationLatency).
func NewValidationMetrics(reg prometheus.Registerer) (*prometheus.CounterVec, prometheus.Histogram) {
	validations := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpuguard_agent_enforcer_validations_total",
		Help: "Containers' final adjustments, merged from every NRI plugin, the node enforcer validated, by result: accepted, rejected, error."}, []string{"result"})
	latency := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "gpuguard_agent_enforcer_validation_seconds",
		Help: "Time the node enforcer takes to validate one container's final adjustment.", Buckets: decisionBuckets})
	reg.MustRegister(validations, latency)
	return validations, latency
}
