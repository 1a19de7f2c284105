package framework

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// daemon is one of the node's long-running processes, logging to a file.
type daemon struct {
	name string
	Log  string
	cmd  *exec.Cmd
	done chan error
}

// startDaemon starts bin with args and extra environment, appending its
// output to logDir/name.log.
func startDaemon(name, logDir string, env []string, bin string, args ...string) (*daemon, error) {
	d := &daemon{name: name, Log: filepath.Join(logDir, name+".log")}
	log, err := os.OpenFile(d.Log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	d.cmd = exec.Command(bin, args...)
	d.cmd.Env = append(os.Environ(), env...)
	// In its log directory, never the test's working directory (the source
	// tree): the kubelet's log cleanup globs a container's log path plus
	// "*" and removes what it finds, so a container without a log path had
	// it remove the first entry of its working directory, a source file.
	d.cmd.Dir = logDir
	d.cmd.Stdout, d.cmd.Stderr = log, log
	// Its own process group: a terminal's Ctrl-C reaches the test binary,
	// which then stops the node in order.
	// If the test binary dies without stopping the node, so does the daemon.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := d.cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	d.done = make(chan error, 1)
	go func() { d.done <- d.cmd.Wait(); log.Close() }()
	return d, nil
}

// exited returns an error when the process has ended, for condition waits.
func (d *daemon) exited() error {
	select {
	case err := <-d.done:
		d.done <- err
		return fmt.Errorf("%s exited: %v\n%s", d.name, err, Tail(d.Log))
	default:
		return nil
	}
}

// stop sends SIGTERM, then SIGKILL when the process has not ended in time.
func (d *daemon) stop(grace time.Duration) error {
	if d == nil || d.cmd.Process == nil {
		return nil
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	// The exit is put back, so that stopping a stopped daemon returns at
	// once rather than waiting for an exit already taken.
	select {
	case err := <-d.done:
		d.done <- err
		return nil
	case <-time.After(grace):
	}
	_ = d.cmd.Process.Kill()
	select {
	case err := <-d.done:
		d.done <- err
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("%s (pid %d) did not exit", d.name, d.cmd.Process.Pid)
	}
}

// killShims ends the containerd shims serving the node's containerd (found
// by the node root in their command line), each by its process ID. They
// outlive containerd by design, and a stopped node must leave none behind.
func killShims(root string) {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if strings.HasSuffix(args[0], "containerd-shim-runc-v2") && strings.Contains(string(cmdline), root) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// unmountUnder detaches every mount below root, deepest first, so that the
// root can be removed.
func unmountUnder(root string) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var points []string
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) > 4 && strings.HasPrefix(fields[4], root+"/") {
			points = append(points, fields[4])
		}
	}
	for i := len(points) - 1; i >= 0; i-- {
		_ = unix.Unmount(points[i], unix.MNT_DETACH)
	}
}
