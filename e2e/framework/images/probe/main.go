// Command probe is the node suite's test workload: it reports what the
// container was given, i.e. what a CUDA program in it could open. Its image
// carries ENV NVIDIA_VISIBLE_DEVICES=all, as CUDA base images do.
//
// It prints its whole environment to its log and writes a JSON report to
// /dev/termination-log, which the kubelet copies into the pod's status: the
// NVIDIA_* variables, the entries under /var/run/nvidia-container-devices
// (the volume-mounts device list) and the /dev/nvidia* nodes it can see.
// With PROBE_HOLD set it keeps running afterwards, for the node verifier.
// It also reports its groups (the primary one first) and, with
// PROBE_CONNECT naming a unix socket, whether it could connect to it.
package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
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
		r.Connect = connect(sock)
	}
	out, _ := json.Marshal(r)
	fmt.Println(string(out))
	if err := os.WriteFile("/dev/termination-log", out, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "writing the termination log:", err)
		os.Exit(1)
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
