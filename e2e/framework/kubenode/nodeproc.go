package kubenode

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

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
