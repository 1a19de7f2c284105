package verifier

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/gpuguard/gpuguard/config"
)

// typicalDev is what a container's /dev holds besides its GPU: the runtime's
// default nodes and the NVIDIA control nodes.
var typicalDev = []string{"full", "zero", "random", "urandom", "tty", "ptmx-alias", "nvidiactl-alias", "nvidia-uvm-alias", "nvidia-uvm-tools-alias"}

// BenchmarkCheck100Containers is one verifier pass over 100 running containers,
// each with a typical /dev and one allocated GPU, and reports the CPU time the
// pass used (user + system, from getrusage) besides its wall time.
func BenchmarkCheck100Containers(b *testing.B) {
	n := newNode(b)
	inv := testInventory()
	var containers fakeContainers
	allocs := fakeAllocations{}
	for i := range 100 {
		k := key("team-a", fmt.Sprintf("pod-%d", i), "main")
		devs := map[string]int{fmt.Sprintf("nvidia%d", i%3): i % 3}
		pid := n.container(devs)
		for j, name := range typicalDev {
			n.mknod(fmt.Sprintf("%s/%d/root/dev/%s", n.procRoot, pid, name), 1, uint32(5+j))
		}
		containers = append(containers, Container{ID: fmt.Sprint(i), Key: k, PID: pid})
		allocs[k] = map[string][]string{"nvidia.com/gpu": {fmt.Sprintf("GPU-%d", i%3)}}
	}
	pol := config.Default()
	v := &Verifier{Containers: containers, Allocations: allocs, Table: NewDeviceTable(inv), Resolver: NewGPUResolver(inv),
		IsGPUResource: pol.Spec.IsGPUResource, ProcRoot: n.procRoot}
	ctx := context.Background()
	// The reference: only reading each container's /dev directory, the least
	// any look at what a container can open costs.
	b.Run("reference-readdir", func(b *testing.B) {
		measure(b, func() {
			for _, c := range containers {
				if _, err := os.ReadDir(fmt.Sprintf("%s/%d/root/dev", n.procRoot, c.PID)); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
	b.Run("pass", func(b *testing.B) {
		measure(b, func() {
			p, err := v.Check(ctx)
			if err != nil || len(p.Findings) != 0 {
				b.Fatalf("findings %v, err %v; want none", p.Findings, err)
			}
		})
	})
}

func measure(b *testing.B, f func()) {
	cpu0 := cpuTime()
	for b.Loop() {
		f()
	}
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N)/1e3, "cpu-ms/op")
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
