// Package verifier is the node's ground truth: it compares the GPUs each running
// container can open (the device nodes in its root's /dev, matched to GPUs by
// their numbers) with the GPUs the kubelet allocated to it (the PodResources
// API). A container that reaches a GPU it was not allocated is a finding,
// however it got there: image ENV, a Secret poured in through envFrom, a pod
// from before gpuguard's install or from a webhook outage, an annotation
// injector nobody listed, or a node configured in a way the policy did not
// foresee.
//
// Admission enumerates channels; this package does not: it looks at what the
// runtime actually gave the container.
package verifier

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Modes of the verifier.
const (
	ModeOff     = "off"
	ModeReport  = "report"
	ModeEnforce = "enforce"
)

// Finding is a container that can open a GPU the kubelet did not allocate to it.
type Finding struct {
	Container Container
	GPU       Reached
	// How the access was seen: "device-node" (in the container's /dev).
	SeenBy string
	// Allocated are the GPU UUIDs the kubelet allocated to the container.
	Allocated []string
	// Exempt names the exemption that covers the pod ("namespace gpu-operator");
	// an exempt finding is logged at info level only.
	Exempt string
	// ReportOnly says why a finding is reported (log, Event, metric,
	// ClusterReport) but never acted on, even in enforce mode: the
	// container's allocation names devices by a scheme the agent cannot
	// resolve (a sharing scheduler's own IDs), so what it was given is
	// unknown, and stopping it would evict legitimate pods in a loop.
	ReportOnly string
}

// Pass is the result of one look at the node.
type Pass struct {
	Containers int
	Findings   []Finding
	// Skipped are containers whose root could not be read (gone meanwhile).
	Skipped int
	// Unverifiable are containers whose /dev is too large to walk: reported,
	// never passed over silently.
	Unverifiable []Container
	// ProcessesErr is why NVML's process view is missing from this pass; the
	// device-node view stands alone then.
	ProcessesErr error
}

// Verifier compares reach with allocation.
type Verifier struct {
	Containers  ContainerSource
	Allocations AllocationSource
	Table       *DeviceTable
	Resolver    *GPUResolver
	// IsGPUResource says which resource names allocate GPUs (the policy's
	// gpuResources).
	IsGPUResource func(string) bool
	// ProcRoot is the host's /proc (the agent needs the host PID namespace).
	ProcRoot string
	// Exempt names the policy exemption that lets a container reach GPUs
	// it was not allocated, or "" (Exemptions.OfGPUs); allocated says
	// whether it was allocated any.
	Exempt func(ctx context.Context, c Container, allocated bool) string
	// Fraction is how many GPUs a container may reach without an allocation
	// because a GPU-sharing scheduler gave it a fraction (KAI Scheduler's,
	// with the policy's integration on); nil means none.
	Fraction func(ctx context.Context, c Container) int
	// Self is the agent's own pod, whose containers are understood, not judged.
	Self ContainerKey
	// Processes, when set, adds NVML's view: a container whose process runs
	// on a GPU it was not allocated is a finding too (seen by "nvml-process").
	Processes ProcessSource
	// Checkpoint, when set, gives the devices of containers PodResources
	// leaves out (init containers).
	Checkpoint *Checkpoint
}

// Check looks at every running container once.
func (v *Verifier) Check(ctx context.Context) (Pass, error) {
	containers, err := v.Containers.Running(ctx)
	if err != nil {
		return Pass{}, err
	}
	allocs, err := v.Allocations.Allocations(ctx)
	if err != nil {
		return Pass{}, err
	}
	p := Pass{Containers: len(containers)}
	reached := map[string][]Reached{} // container ID -> GPUs
	for _, c := range containers {
		if v.isSelf(c.Key) {
			continue
		}
		r, err := v.Table.ReachableGPUs(filepath.Join(v.ProcRoot, strconv.Itoa(c.PID), "root"))
		if err != nil {
			if errors.Is(err, os.ErrNotExist) || errors.Is(err, os.ErrPermission) {
				p.Skipped++
				continue
			}
			if errors.Is(err, ErrTooManyDevEntries) {
				// A finding of its own: a tenant could otherwise hide a
				// GPU behind 10,000 device nodes.
				p.Unverifiable = append(p.Unverifiable, c)
				p.Findings = append(p.Findings, v.unverifiable(ctx, c))
				continue
			}
			return Pass{}, fmt.Errorf("container %s (pid %d): %w", c.Key, c.PID, err)
		}
		for i := range r {
			r[i].SeenBy = SeenByDeviceNode
		}
		reached[c.ID] = r
	}
	if v.Processes != nil {
		p.ProcessesErr = v.addProcesses(containers, reached)
	}
	var checkpoint map[string]PodDevices
	for _, c := range containers {
		alloc, ok := allocs[c.Key]
		if !ok && v.Checkpoint != nil && len(reached[c.ID]) > 0 {
			// Not in PodResources: an init container, whose devices only
			// the kubelet's checkpoint records (read once a pass).
			if checkpoint == nil {
				if checkpoint, err = v.Checkpoint.Pods(); err != nil {
					return Pass{}, err
				}
			}
			alloc = checkpoint[c.PodUID][c.Key.Container]
		}
		p.Findings = append(p.Findings, v.judge(ctx, c, reached[c.ID], alloc)...)
	}
	return p, nil
}

// How a GPU was seen to be reachable.
const (
	SeenByDeviceNode  = "device-node"
	SeenByNVMLProcess = "nvml-process"
	// SeenByUnverifiable marks the finding of a container whose /dev is too
	// large to walk: which GPUs it can open is unknown (UnverifiableGPU).
	SeenByUnverifiable = "unverifiable"
)

// UnverifiableGPU stands for the GPUs a container whose /dev could not be
// walked may open.
const UnverifiableGPU = "unverifiable"

// unverifiable is the finding of a container whose /dev is too large to
// walk: logged, evented, reported and, in enforce mode, stopped like any
// other, unless its pod is exempt.
func (v *Verifier) unverifiable(ctx context.Context, c Container) Finding {
	f := Finding{Container: c, GPU: Reached{UUID: UnverifiableGPU, Path: "/dev"}, SeenBy: SeenByUnverifiable}
	if v.Exempt != nil {
		f.Exempt = v.Exempt(ctx, c, false)
	}
	return f
}

// addProcesses adds, to what each container reaches, the GPUs NVML says its
// processes run on.
func (v *Verifier) addProcesses(containers []Container, reached map[string][]Reached) error {
	byGPU, err := v.Processes.GPUProcesses()
	if err != nil {
		return err
	}
	byID := make(map[string]Container, len(containers))
	for _, c := range containers {
		if !v.isSelf(c.Key) {
			byID[c.ID] = c
		}
	}
	for uuid, pids := range byGPU {
		for _, pid := range pids {
			c, ok, err := containerOfPID(v.ProcRoot, pid, byID)
			if err != nil {
				return fmt.Errorf("the cgroup of NVML process %d: %w", pid, err)
			}
			if ok {
				reached[c.ID] = addSeen(reached[c.ID], Reached{UUID: uuid, Path: "pid " + strconv.Itoa(pid)}, SeenByNVMLProcess)
			}
		}
	}
	return nil
}

// addSeen records that r was also seen by how, once per GPU.
func addSeen(list []Reached, r Reached, how string) []Reached {
	for i := range list {
		if list[i].UUID == r.UUID {
			if !strings.Contains(list[i].SeenBy, how) {
				list[i].SeenBy += "," + how
			}
			return list
		}
	}
	r.SeenBy = how
	return append(list, r)
}

func (v *Verifier) judge(ctx context.Context, c Container, reached []Reached, alloc map[string][]string) []Finding {
	if len(reached) == 0 {
		return nil
	}
	allowed := v.Resolver.GPUs(alloc, v.IsGPUResource)
	var reportOnly string
	if unknown := v.Resolver.Unknown(alloc, v.IsGPUResource); len(unknown) > 0 {
		reportOnly = fmt.Sprintf("allocated device IDs %v name no device of this node's inventory (a scheme gpuguard does not resolve)", unknown)
	}
	var out []Finding
	for _, r := range reached {
		if allowed[r.UUID] {
			continue
		}
		f := Finding{Container: c, GPU: r, SeenBy: r.SeenBy, Allocated: sortedKeys(allowed), ReportOnly: reportOnly}
		if v.Exempt != nil {
			f.Exempt = v.Exempt(ctx, c, len(allowed) > 0)
		}
		out = append(out, f)
	}
	// A scheduler's fraction covers up to its GPU count of unallocated GPUs,
	// and nothing when the container reaches more.
	if len(out) > 0 && v.Fraction != nil {
		if n := v.Fraction(ctx, c); n > 0 && len(out) <= n {
			for i := range out {
				if out[i].Exempt == "" {
					out[i].Exempt = fmt.Sprintf("KAI Scheduler fraction (%d GPU)", n)
				}
			}
		}
	}
	return out
}

func (v *Verifier) isSelf(k ContainerKey) bool {
	return v.Self.Pod != "" && k.Namespace == v.Self.Namespace && k.Pod == v.Self.Pod
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Close closes the connections of the sources that have one.
func (v *Verifier) Close() {
	for _, s := range []any{v.Containers, v.Allocations} {
		if c, ok := s.(interface{ Close() error }); ok {
			_ = c.Close()
		}
	}
}
