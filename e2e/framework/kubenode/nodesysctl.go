package kubenode

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// The host settings a node changes: the kubelet sets the kernel's panic and
// overcommit behaviour it expects (protectKernelDefaults is off), and the CNI
// bridge plugin turns on IPv4 forwarding for its gateway.
var (
	kubeletSysctls = []string{"kernel/panic", "kernel/panic_on_oops", "vm/overcommit_memory"}
	bridgeSysctls  = []string{"net/ipv4/ip_forward"}
)

// saveSysctls reads the settings the node will change, so that Stop can put
// them back; with network, the bridge plugin's too.
func saveSysctls(network bool) (map[string]string, error) {
	keys := slices.Clone(kubeletSysctls)
	if network {
		keys = append(keys, bridgeSysctls...)
	}
	saved := map[string]string{}
	for _, k := range keys {
		data, err := os.ReadFile(filepath.Join("/proc/sys", k))
		if err != nil {
			return nil, err
		}
		saved[k] = strings.TrimSpace(string(data))
	}
	return saved, nil
}

// restoreSysctls writes the saved settings back.
func restoreSysctls(saved map[string]string) error {
	var errs []error
	for k, v := range saved {
		errs = append(errs, os.WriteFile(filepath.Join("/proc/sys", k), []byte(v+"\n"), 0o644))
	}
	return errors.Join(errs...)
}
