package framework

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// BuildGPUGuard builds the static gpuguard binary (./cmd/gpuguard).
func BuildGPUGuard(repoRoot, outDir string) (string, error) {
	return buildBinary(repoRoot, outDir, "gpuguard", "./cmd/gpuguard", false)
}

// BuildAgent builds gpuguard-agent (cgo, for NVML) into outDir.
func BuildAgent(repoRoot, outDir string) (string, error) {
	return buildBinary(repoRoot, outDir, "gpuguard-agent", "./cmd/gpuguard-agent", true)
}

// buildBinary builds with -trimpath, as make build and the release images
// do, so that the build cache serves all of them.
func buildBinary(repoRoot, outDir, name, pkg string, cgo bool) (string, error) {
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

// Webhook is the real `gpuguard webhook` binary running as its own process.
type Webhook struct {
	Binary     string
	Kubeconfig string
	CertDir    string
	// Port serves /mutate and /validate; ProbePort /healthz and /readyz;
	// MetricsPort /metrics.
	Port, ProbePort, MetricsPort int
	// Extra flags, such as --cert-secret.
	Extra []string
	// Env is added to the process's environment.
	Env []string
	// Log collects the process's output.
	Log string

	cmd  *exec.Cmd
	done chan error
}

// NewWebhook picks free ports for a webhook process.
func NewWebhook(binary, kubeconfig, certDir, logDir string) (*Webhook, error) {
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	return &Webhook{Binary: binary, Kubeconfig: kubeconfig, CertDir: certDir, Port: ports[0], ProbePort: ports[1], MetricsPort: ports[2],
		Log: filepath.Join(logDir, "gpuguard-webhook.log")}, nil
}

// Start starts the process; Ready tells when it serves.
func (w *Webhook) Start(policyConfigMap string) error {
	args := []string{"webhook",
		"--kubeconfig", w.Kubeconfig, "--policy-configmap", policyConfigMap,
		"--host", "127.0.0.1", "--port", strconv.Itoa(w.Port), "--cert-dir", w.CertDir,
		"--health-probe-bind-address", fmt.Sprintf("127.0.0.1:%d", w.ProbePort), "--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", w.MetricsPort),
		"--configmap-cache-ttl", "1s",
	}
	log, err := os.OpenFile(w.Log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	w.cmd = exec.Command(w.Binary, append(args, w.Extra...)...)
	w.cmd.Env = append(os.Environ(), w.Env...)
	w.cmd.Stdout, w.cmd.Stderr = log, log
	if err := w.cmd.Start(); err != nil {
		log.Close()
		return err
	}
	w.done = make(chan error, 1)
	go func() { w.done <- w.cmd.Wait(); log.Close() }()
	return nil
}

// WaitReady polls /readyz until the webhook has a policy and serves TLS.
func (w *Webhook) WaitReady(ctx context.Context, timeout time.Duration) error {
	url := fmt.Sprintf("http://127.0.0.1:%d/readyz", w.ProbePort)
	return Poll(ctx, timeout, func() (bool, error) {
		select {
		case err := <-w.done:
			return false, fmt.Errorf("webhook exited: %v (log: %s)", err, w.Log)
		default:
		}
		resp, err := http.Get(url)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

// Metrics returns the webhook's metrics: sample name with labels, as
// exposed, to value.
func (w *Webhook) Metrics(ctx context.Context) (map[string]float64, error) {
	return scrape(ctx, fmt.Sprintf("http://127.0.0.1:%d/metrics", w.MetricsPort))
}

// Decisions sums the webhook's admission decisions whose labels contain
// label (such as `operation="UPDATE"`).
func (w *Webhook) Decisions(ctx context.Context, label string) (float64, error) {
	m, err := w.Metrics(ctx)
	if err != nil {
		return 0, err
	}
	return SumMetrics(m, func(k string) bool {
		return strings.HasPrefix(k, "gpuguard_admission_decisions_total{") && strings.Contains(k, label)
	}), nil
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

// PeakRSS is the most resident memory the running process has had, in
// bytes (VmHWM).
func (w *Webhook) PeakRSS() (int64, error) {
	if w.cmd == nil || w.cmd.Process == nil {
		return 0, errors.New("the webhook is not running")
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", w.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmHWM in /proc/PID/status")
}

// Stop sends SIGTERM and waits for a clean exit.
func (w *Webhook) Stop() error { return w.signal(syscall.SIGTERM) }

// Kill ends the process at once, as a crash would.
func (w *Webhook) Kill() error { return w.signal(syscall.SIGKILL) }

func (w *Webhook) signal(sig syscall.Signal) error {
	if w.cmd == nil || w.cmd.Process == nil {
		return nil
	}
	_ = w.cmd.Process.Signal(sig)
	select {
	case err := <-w.done:
		w.cmd = nil
		if sig == syscall.SIGKILL {
			return nil
		}
		return err
	case <-time.After(90 * time.Second):
		return fmt.Errorf("webhook did not exit after %v", sig)
	}
}

// freePorts asks the kernel for n unused loopback ports, all different: each
// stays held until all are chosen, since a port just closed may be handed out
// again (two processes given the same port fail one another's start).
func freePorts(n int) ([]int, error) {
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
