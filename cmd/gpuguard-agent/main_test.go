package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuguard/gpuguard/testsupport/kubelettest"
)

// TestBinaryServesMockNode builds the binary and runs it the way the demo
// does: --backend=mock:dgxa100 against a kubelet socket in a directory.
func TestBinaryServesMockNode(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "gpuguard-agent")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	dir, err := os.MkdirTemp("", "gg")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	k, err := kubelettest.Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Stop()

	cmd := exec.Command(bin, "--backend=mock:dgxa100", "--device-plugin-dir", dir, "--node-name", "demo-node",
		"--metrics-addr=127.0.0.1:0", "--host-root", t.TempDir())
	logs := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// Kill on early failure; after a clean exit this is a harmless no-op.
	defer func() { _ = cmd.Process.Kill() }()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	regs, err := k.WaitFor(ctx, func(r []*pluginapi.RegisterRequest) bool { return len(r) > 0 })
	if err != nil {
		t.Fatalf("%v\nlogs:\n%s", err, logs.String())
	}
	if regs[0].ResourceName != "nvidia.com/gpu" {
		t.Fatalf("registered %v", regs[0])
	}
	c, closeFn, err := kubelettest.Dial(dir, regs[0].Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	if _, _, err := kubelettest.FirstList(ctx, c, 8); err != nil {
		t.Fatal(err)
	}
	if status, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/status"); err == nil {
		for _, line := range strings.Split(string(status), "\n") {
			if strings.HasPrefix(line, "VmRSS:") {
				t.Logf("agent resident memory serving 8 mock GPUs: %s", strings.TrimSpace(strings.TrimPrefix(line, "VmRSS:")))
			}
		}
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v\nlogs:\n%s", err, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no exit after SIGTERM")
	}
	if _, err := os.Stat(filepath.Join(dir, regs[0].Endpoint)); !os.IsNotExist(err) {
		t.Errorf("socket left behind: %v", err)
	}
	for _, want := range []string{`"msg":"discovered GPUs"`, `"msg":"node hardening report"`, "NODE NOT HARDENED"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("logs lack %s", want)
		}
	}
	// The webhook's shape: JSON objects with an ISO 8601 "ts".
	for _, line := range strings.Split(logs.String(), "\n") {
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Errorf("log line is not JSON: %q", line)
		} else if ts, _ := m["ts"].(string); !strings.Contains(ts, "T") {
			t.Errorf("log line without an ISO 8601 ts: %q", line)
		}
	}
}

// syncBuffer collects the agent's output; the test reads it while the
// process may still write.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
