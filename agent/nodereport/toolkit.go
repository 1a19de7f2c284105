// Package nodereport reads how the node's NVIDIA Container Toolkit and
// containerd are configured, and turns that into a hardening report.
package nodereport

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/pelletier/go-toml/v2"
)

// Toolkit settings and their upstream defaults (NVIDIA Container Toolkit).
const (
	KeyAcceptEnvvarUnprivileged = "accept-nvidia-visible-devices-envvar-when-unprivileged"
	KeyAcceptVolumeMounts       = "accept-nvidia-visible-devices-as-volume-mounts"
	KeyRuntimeMode              = "nvidia-container-runtime.mode"
	KeyLdconfig                 = "nvidia-container-cli.ldconfig"

	defaultRuntimeMode = "auto"
	defaultLdconfig    = "@/sbin/ldconfig"
)

// Well-known places of the toolkit configuration, relative to the host root.
const (
	OperatorToolkitConfig = "/usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml"
	DefaultToolkitConfig  = "/etc/nvidia-container-runtime/config.toml"
	// OperatorRuntimeWrapper is the GPU Operator's wrapper script for the
	// runtime; it exports NVIDIA_CTK_CONFIG_FILE_PATH.
	OperatorRuntimeWrapper = "/usr/local/nvidia/toolkit/nvidia-container-runtime"
	// EnvConfigPath is the variable the toolkit reads its config path from.
	EnvConfigPath = "NVIDIA_CTK_CONFIG_FILE_PATH"
)

// ToolkitConfig is the part of config.toml gpuguard cares about, with the
// toolkit's defaults applied for absent keys.
type ToolkitConfig struct {
	Path string // where it was read

	AcceptEnvvarUnprivileged bool
	AcceptVolumeMounts       bool
	RuntimeMode              string
	Ldconfig                 string
	CDIAnnotationPrefixes    []string
	CDISpecDirs              []string
	CDIDefaultKind           string
}

type rawToolkitConfig struct {
	AcceptEnvvarUnprivileged *bool `toml:"accept-nvidia-visible-devices-envvar-when-unprivileged"`
	AcceptVolumeMounts       *bool `toml:"accept-nvidia-visible-devices-as-volume-mounts"`
	CLI                      struct {
		Ldconfig *string `toml:"ldconfig"`
	} `toml:"nvidia-container-cli"`
	Runtime struct {
		Mode  *string `toml:"mode"`
		Modes struct {
			CDI struct {
				DefaultKind        string   `toml:"default-kind"`
				AnnotationPrefixes []string `toml:"annotation-prefixes"`
				SpecDirs           []string `toml:"spec-dirs"`
			} `toml:"cdi"`
		} `toml:"modes"`
	} `toml:"nvidia-container-runtime"`
}

// ParseToolkitConfig parses a toolkit config.toml.
func ParseToolkitConfig(data []byte, path string) (*ToolkitConfig, error) {
	var raw rawToolkitConfig
	if err := toml.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", path, err)
	}
	c := &ToolkitConfig{
		Path:                     path,
		AcceptEnvvarUnprivileged: true,
		RuntimeMode:              defaultRuntimeMode,
		Ldconfig:                 defaultLdconfig,
		CDIDefaultKind:           "nvidia.com/gpu",
		CDIAnnotationPrefixes:    []string{"cdi.k8s.io/"},
		CDISpecDirs:              []string{"/etc/cdi", "/var/run/cdi"},
	}
	if raw.AcceptEnvvarUnprivileged != nil {
		c.AcceptEnvvarUnprivileged = *raw.AcceptEnvvarUnprivileged
	}
	if raw.AcceptVolumeMounts != nil {
		c.AcceptVolumeMounts = *raw.AcceptVolumeMounts
	}
	if raw.Runtime.Mode != nil && *raw.Runtime.Mode != "" {
		c.RuntimeMode = *raw.Runtime.Mode
	}
	if raw.CLI.Ldconfig != nil {
		c.Ldconfig = *raw.CLI.Ldconfig
	}
	if k := raw.Runtime.Modes.CDI.DefaultKind; k != "" {
		c.CDIDefaultKind = k
	}
	if p := raw.Runtime.Modes.CDI.AnnotationPrefixes; len(p) > 0 {
		c.CDIAnnotationPrefixes = p
	}
	if d := raw.Runtime.Modes.CDI.SpecDirs; len(d) > 0 {
		c.CDISpecDirs = d
	}
	return c, nil
}

// Locator finds configuration files on the host.
type Locator struct {
	// HostRoot is where the host's file system is mounted ("/" when the
	// agent sees the host directly).
	HostRoot string
	// ToolkitConfig overrides the search (a host path).
	ToolkitConfig string
	// ContainerdConfig overrides the search (a host path).
	ContainerdConfig string
	// Getenv reads the agent's environment; nil means os.Getenv.
	Getenv func(string) string
}

func (l Locator) host(p string) string {
	root := l.HostRoot
	if root == "" {
		root = "/"
	}
	return filepath.Join(root, p)
}

// FindToolkitConfig returns the host path of the toolkit config the runtime
// reads, in this order: the override, NVIDIA_CTK_CONFIG_FILE_PATH in the
// agent's environment, the same variable in the GPU Operator's runtime
// wrapper, the GPU Operator location, /etc. Empty when there is none.
func (l Locator) FindToolkitConfig() (string, error) {
	if l.ToolkitConfig != "" {
		if _, err := os.Stat(l.host(l.ToolkitConfig)); err != nil {
			return "", fmt.Errorf("toolkit config given on the command line: %w", err)
		}
		return l.ToolkitConfig, nil
	}
	getenv := l.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	var candidates []string
	if p := getenv(EnvConfigPath); p != "" {
		candidates = append(candidates, p)
	}
	if p := wrapperConfigPath(l.host(OperatorRuntimeWrapper)); p != "" {
		candidates = append(candidates, p)
	}
	candidates = append(candidates, OperatorToolkitConfig, DefaultToolkitConfig)
	for _, c := range candidates {
		if st, err := os.Stat(l.host(c)); err == nil && st.Mode().IsRegular() {
			return c, nil
		}
	}
	return "", nil
}

// LoadToolkitConfig finds and parses the toolkit config; nil, nil when the
// node has none.
func (l Locator) LoadToolkitConfig() (*ToolkitConfig, error) {
	p, err := l.FindToolkitConfig()
	if err != nil || p == "" {
		return nil, err
	}
	data, err := os.ReadFile(l.host(p))
	if err != nil {
		return nil, err
	}
	return ParseToolkitConfig(data, p)
}

// wrapperConfigPath reads NVIDIA_CTK_CONFIG_FILE_PATH from a shell wrapper
// script ("NVIDIA_CTK_CONFIG_FILE_PATH=/x/config.toml" possibly after
// "export " and in quotes). Binaries and missing files give "".
func wrapperConfigPath(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 4096), 64*1024)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		line = strings.TrimPrefix(line, "export ")
		for _, field := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(field, EnvConfigPath+"="); ok {
				v = strings.Trim(v, `"'`)
				if strings.HasPrefix(v, "/") {
					return v
				}
			}
		}
	}
	return ""
}
