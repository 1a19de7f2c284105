package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gpuguard/gpuguard/e2e/framework"
)

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
	ports, err := framework.FreePorts(3)
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
	return framework.Poll(ctx, timeout, func() (bool, error) {
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
	return framework.Scrape(ctx, fmt.Sprintf("http://127.0.0.1:%d/metrics", w.MetricsPort))
}

// Decisions sums the webhook's admission decisions whose labels contain
// label (such as `operation="UPDATE"`).
func (w *Webhook) Decisions(ctx context.Context, label string) (float64, error) {
	m, err := w.Metrics(ctx)
	if err != nil {
		return 0, err
	}
	return framework.SumMetrics(m, func(k string) bool {
		return strings.HasPrefix(k, "gpuguard_admission_decisions_total{") && strings.Contains(k, label)
	}), nil
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
