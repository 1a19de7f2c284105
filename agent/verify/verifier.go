// Package verify is the node's ground truth: it compares the GPUs each running
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
package verify

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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
}

// Pass is the result of one look at the node.
type Pass struct {
	Containers int
	Findings   []Finding
	// Skipped are containers whose root could not be read (gone meanwhile).
	Skipped int
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
	// Exempt names the exemption covering a pod's namespace, or "".
	Exempt func(namespace string) string
	// Self is the agent's own pod, whose containers are understood, not judged.
	Self ContainerKey
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
	for _, c := range containers {
		if v.isSelf(c.Key) {
			continue
		}
		reached, err := v.Table.ReachableGPUs(filepath.Join(v.ProcRoot, strconv.Itoa(c.PID), "root"))
		if err != nil {
			if errors.Is(err, os.ErrNotExist) || errors.Is(err, os.ErrPermission) {
				p.Skipped++
				continue
			}
			return Pass{}, fmt.Errorf("container %s (pid %d): %w", c.Key, c.PID, err)
		}
		p.Findings = append(p.Findings, v.judge(c, reached, allocs[c.Key])...)
	}
	return p, nil
}

func (v *Verifier) judge(c Container, reached []Reached, alloc map[string][]string) []Finding {
	if len(reached) == 0 {
		return nil
	}
	allowed := v.Resolver.GPUs(alloc, v.IsGPUResource)
	var out []Finding
	for _, r := range reached {
		if allowed[r.UUID] {
			continue
		}
		f := Finding{Container: c, GPU: r, SeenBy: "device-node", Allocated: sortedKeys(allowed)}
		if v.Exempt != nil {
			f.Exempt = v.Exempt(c.Key.Namespace)
		}
		out = append(out, f)
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
