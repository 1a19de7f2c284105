// Command probe is the node suite's test workload: it reports what the
// container was given, i.e. what a CUDA program in it could open. Its image
// carries ENV NVIDIA_VISIBLE_DEVICES=all, as CUDA base images do.
//
// It prints its whole environment to its log and writes a JSON report to
// /dev/termination-log, which the kubelet copies into the pod's status: the
// NVIDIA_* variables, the entries under /var/run/nvidia-container-devices
// (the volume-mounts device list) and the /dev/nvidia* nodes it can see.
// With PROBE_HOLD set it keeps running afterwards, for the node verifier;
// with PROBE_IGNORE_TERM, it ignores SIGTERM too.
// It also reports its groups (the primary one first) and, with
// PROBE_CONNECT naming a unix socket, whether it could connect to it; with
// PROBE_ENTER_UID too, it connects to that socket as another probe process
// of that user sees it, through /proc/PID/root, after taking that process's
// user and group and keeping root's group (a root process sharing its
// process namespace can; see namespace-entry).
package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// report is what the suite reads back; keep in step with framework.ProbeReport.
type report struct {
	Env             map[string]string `json:"env"`
	DeviceListFiles []string          `json:"deviceListFiles"`
	Devices         []string          `json:"devices"`
	Groups          []int             `json:"groups"`
	Connect         string            `json:"connect,omitempty"`
}

func main() {
	env := os.Environ()
	sort.Strings(env)
	r := report{Env: map[string]string{}}
	for _, kv := range env {
		fmt.Println(kv)
		if k, v, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "NVIDIA_") {
			r.Env[k] = v
		}
	}
	r.DeviceListFiles = list("/var/run/nvidia-container-devices/*")
	r.Devices = list("/dev/nvidia*")
	r.Groups = append([]int{os.Getgid()}, groups()...)
	if sock := os.Getenv("PROBE_CONNECT"); sock != "" {
		if uid := os.Getenv("PROBE_ENTER_UID"); uid != "" {
			r.Connect = enterAndConnect(uid, sock)
		} else {
			r.Connect = connect(sock)
		}
	}
	out, _ := json.Marshal(r)
	fmt.Println(string(out))
	if err := os.WriteFile("/dev/termination-log", out, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "writing the termination log:", err)
		os.Exit(1)
	}
	if os.Getenv("PROBE_IGNORE_TERM") != "" {
		// A workload that will not stop when asked: only SIGKILL ends it.
		signal.Ignore(syscall.SIGTERM, syscall.SIGINT)
		for {
			time.Sleep(time.Hour) // a bare select{} would be a deadlock to the runtime
		}
	}
	if os.Getenv("PROBE_HOLD") != "" {
		// Keep running, as a workload would, until the kubelet stops it.
		stop := make(chan os.Signal, 1)
		signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
		<-stop
	}
}

func list(pattern string) []string {
	paths, _ := filepath.Glob(pattern)
	if paths == nil {
		return []string{}
	}
	return paths
}

func groups() []int {
	g, err := os.Getgroups()
	if err != nil {
		return []int{-1}
	}
	return g
}

// connect is "ok" when a connection to the unix socket at path succeeds,
// else why not.
func connect(path string) string {
	conn, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		return err.Error()
	}
	conn.Close()
	return "ok"
}

// enterAndConnect waits (30 s at most) for another probe process of the
// user uid, takes its user and group with root's group kept as a
// supplementary one, which the kernel's ptrace check lets through (it
// compares users and primary groups only), and connects to sock as that
// process sees it.
func enterAndConnect(uid, sock string) string {
	pid, gid, err := waitForProbeOf(uid, 30*time.Second)
	if err != nil {
		return err.Error()
	}
	u, _ := strconv.Atoi(uid)
	if err := syscall.Setgroups([]int{0}); err != nil {
		return "setgroups: " + err.Error()
	}
	if err := syscall.Setresgid(gid, gid, gid); err != nil {
		return "setresgid: " + err.Error()
	}
	if err := syscall.Setresuid(u, u, u); err != nil {
		return "setresuid: " + err.Error()
	}
	return connect(fmt.Sprintf("/proc/%d/root%s", pid, sock))
}

// waitForProbeOf finds a process named probe, other than this one, whose
// real user is uid, and its primary group.
func waitForProbeOf(uid string, timeout time.Duration) (pid, gid int, err error) {
	deadline := time.Now().Add(timeout)
	for {
		dirs, _ := filepath.Glob("/proc/[0-9]*/status")
		for _, d := range dirs {
			data, err := os.ReadFile(d)
			if err != nil {
				continue
			}
			fields := statusFields(string(data))
			p, _ := strconv.Atoi(filepath.Base(filepath.Dir(d)))
			if p != os.Getpid() && fields["Name"] == "probe" && strings.Fields(fields["Uid"])[0] == uid {
				g, _ := strconv.Atoi(strings.Fields(fields["Gid"])[0])
				return p, g, nil
			}
		}
		if time.Now().After(deadline) {
			return 0, 0, fmt.Errorf("no probe process of user %s within %s", uid, timeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// statusFields parses /proc/PID/status.
func statusFields(status string) map[string]string {
	fields := map[string]string{}
	for line := range strings.SplitSeq(status, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			fields[k] = strings.TrimSpace(v)
		}
	}
	if fields["Uid"] == "" {
		fields["Uid"] = "-"
	}
	if fields["Gid"] == "" {
		fields["Gid"] = "-"
	}
	return fields
}
