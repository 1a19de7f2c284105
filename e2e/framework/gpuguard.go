package framework

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// BuildGPUGuard builds the static gpuguard binary (./cmd/gpuguard).
func BuildGPUGuard(repoRoot, outDir string) (string, error) {
	return BuildBinary(repoRoot, outDir, "gpuguard", "./cmd/gpuguard", false)
}

// BuildAgent builds gpuguard-agent (cgo, for NVML) into outDir.
func BuildAgent(repoRoot, outDir string) (string, error) {
	return BuildBinary(repoRoot, outDir, "gpuguard-agent", "./cmd/gpuguard-agent", true)
}

// BuildBinary builds with -trimpath, as make build and the release images
// do, so that the build cache serves all of them.
func BuildBinary(repoRoot, outDir, name, pkg string, cgo bool) (string, error) {
	bin := filepath.Join(outDir, name)
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, pkg)
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if cgo {
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building %s: %w\n%s", name, err, out)
	}
	return bin, nil
}

// SumMetrics adds up the samples whose name and labels keep selects.
func SumMetrics(m map[string]float64, keep func(string) bool) float64 {
	sum := 0.0
	for k, v := range m {
		if keep(k) {
			sum += v
		}
	}
	return sum
}

// MetricPrefix selects the samples of one metric, whatever their labels.
func MetricPrefix(name string) func(string) bool {
	return func(k string) bool { return strings.HasPrefix(k, name+"{") }
}

// FreePorts asks the kernel for n unused loopback ports, all different: each
// stays held until all are chosen, since a port just closed may be handed out
// again (two processes given the same port fail one another's start).
func FreePorts(n int) ([]int, error) {
	ports := make([]int, n)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports, nil
}

// Poll calls cond every 100 ms until it is true, fails, or timeout passes.
func Poll(ctx context.Context, timeout time.Duration, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("condition not met within %v", timeout)
		case <-tick.C:
		}
	}
}
