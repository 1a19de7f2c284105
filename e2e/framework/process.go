package framework

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// Daemon is one of the long-running processes a suite starts (etcd, the
// API server, KWOK, a node's containerd, kubelet or agent), logging to a file.
type Daemon struct {
	Name string
	Log  string
	cmd  *exec.Cmd
	done chan error
}

// StartDaemon starts bin with args and extra environment, appending its
// output to logDir/name.log.
func StartDaemon(name, logDir string, env []string, bin string, args ...string) (*Daemon, error) {
	d := &Daemon{Name: name, Log: filepath.Join(logDir, name+".log")}
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

// Exited returns an error when the process has ended, for condition waits.
func (d *Daemon) Exited() error {
	select {
	case err := <-d.done:
		d.done <- err
		return fmt.Errorf("%s exited: %v\n%s", d.Name, err, Tail(d.Log))
	default:
		return nil
	}
}

// Stop sends SIGTERM, then SIGKILL when the process has not ended in time.
func (d *Daemon) Stop(grace time.Duration) error {
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
		return fmt.Errorf("%s (pid %d) did not exit", d.Name, d.cmd.Process.Pid)
	}
}

// Kill sends SIGKILL, as the kernel's OOM killer does: the process gets no
// chance to clean up. It returns once the process has ended.
func (d *Daemon) Kill() error {
	if d == nil || d.cmd.Process == nil {
		return nil
	}
	_ = d.cmd.Process.Kill()
	select {
	case err := <-d.done:
		d.done <- err
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("%s (pid %d) did not exit on SIGKILL", d.Name, d.cmd.Process.Pid)
	}
}

// Freeze stops the process (SIGSTOP) until Thaw: it keeps its connections
// and answers nothing.
func (d *Daemon) Freeze() error { return d.cmd.Process.Signal(syscall.SIGSTOP) }

// Thaw lets a frozen process run again (SIGCONT).
func (d *Daemon) Thaw() error { return d.cmd.Process.Signal(syscall.SIGCONT) }

// Tail returns the end of a log file, for error messages.
func Tail(path string) string {
	data, _ := os.ReadFile(path)
	if len(data) > 6000 {
		data = data[len(data)-6000:]
	}
	return string(data)
}

// Command is the binary and the arguments the process was started with,
// to start it again.
func (d *Daemon) Command() (bin string, args []string) { return d.cmd.Path, d.cmd.Args[1:] }
