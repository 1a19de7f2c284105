package nodereport

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/pelletier/go-toml/v2"
)

// Well-known containerd config locations, relative to the host root.
var containerdConfigCandidates = []string{
	"/etc/containerd/config.toml",
	"/var/lib/rancher/rke2/agent/etc/containerd/config.toml",
	"/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
}

// ContainerdRuntime is one runtime handler of the CRI plugin.
type ContainerdRuntime struct {
	Name                 string
	Type                 string
	BinaryName           string
	PodAnnotations       []string
	ContainerAnnotations []string
}

// IsNVIDIA says whether the handler runs the NVIDIA Container Runtime.
func (r ContainerdRuntime) IsNVIDIA() bool {
	return strings.Contains(r.BinaryName, "nvidia-container-runtime") || strings.HasPrefix(r.Name, "nvidia")
}

// ContainerdConfig is what gpuguard reads from containerd's config.
type ContainerdConfig struct {
	Paths          []string // the main file, then its imports
	Version        int
	DefaultRuntime string
	Runtimes       map[string]ContainerdRuntime
	// CDIEnabled is nil when the file does not say and the default depends
	// on the containerd release (off in 1.7, on in 2.x).
	CDIEnabled *bool
	// NRIEnabled: nil when unknown.
	NRIEnabled    *bool
	NRIPluginPath string
	NRIConfigPath string
	// NRIValidator is NRI's built-in default validator (containerd 2.2
	// and later), [plugins."io.containerd.nri.v1.nri".default_validator].
	NRIValidator NRIValidator
}

// NRIValidator is what gpuguard reads of NRI's default validator: whether
// it runs, the plugins it requires for every container, and the pod
// annotation that lets a container do without them.
type NRIValidator struct {
	Enabled            bool
	RequiredPlugins    []string
	TolerateAnnotation string
}

// Requires reports whether the validator requires the plugin name: by its
// name or by index and name ("90-gpuguard").
func (v NRIValidator) Requires(name string) bool {
	if !v.Enabled {
		return false
	}
	for _, p := range v.RequiredPlugins {
		if p == name || strings.HasSuffix(p, "-"+name) {
			return true
		}
	}
	return false
}

// RequiresEnforcer reports whether containerd refuses every container
// while the node enforcer is not connected: NRI on, its default validator
// on, and the enforcer among its required plugins. Only then does a node
// fail closed, and only then does the agent let admission count the node
// as covered (the enforcer's Lease).
func (c ContainerdConfig) RequiresEnforcer() bool {
	return (c.NRIEnabled == nil || *c.NRIEnabled) && c.NRIValidator.Requires(EnforcerPlugin)
}

// LoadContainerdConfig finds and parses containerd's config (with imports);
// nil, nil when none is found.
func (l Locator) LoadContainerdConfig() (*ContainerdConfig, error) {
	var p string
	if l.ContainerdConfig != "" {
		p = l.ContainerdConfig
		if _, err := os.Stat(l.host(p)); err != nil {
			return nil, fmt.Errorf("containerd config given on the command line: %w", err)
		}
	} else {
		for _, c := range containerdConfigCandidates {
			if st, err := os.Stat(l.host(c)); err == nil && st.Mode().IsRegular() {
				p = c
				break
			}
		}
	}
	if p == "" {
		return nil, nil
	}
	tree, err := readTOML(l.host(p))
	if err != nil {
		return nil, err
	}
	paths := []string{p}
	if imports, ok := tree["imports"].([]any); ok {
		for _, imp := range imports {
			pattern, _ := imp.(string)
			if pattern == "" {
				continue
			}
			if !filepath.IsAbs(pattern) {
				pattern = filepath.Join(filepath.Dir(p), pattern)
			}
			matches, _ := filepath.Glob(l.host(pattern))
			sort.Strings(matches)
			for _, m := range matches {
				sub, err := readTOML(m)
				if err != nil {
					return nil, err
				}
				mergeTOML(tree, sub)
				rel, _ := filepath.Rel(l.host("/"), m)
				paths = append(paths, "/"+rel)
			}
		}
	}
	c := ParseContainerdTree(tree)
	c.Paths = paths
	return c, nil
}

// ParseContainerdConfig parses one containerd config file's contents.
func ParseContainerdConfig(data []byte) (*ContainerdConfig, error) {
	tree := map[string]any{}
	if err := toml.Unmarshal(data, &tree); err != nil {
		return nil, err
	}
	return ParseContainerdTree(tree), nil
}

func readTOML(p string) (map[string]any, error) {
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	tree := map[string]any{}
	if err := toml.Unmarshal(data, &tree); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", p, err)
	}
	return tree, nil
}

// mergeTOML overlays src on dst, table by table (containerd's import rule).
func mergeTOML(dst, src map[string]any) {
	for k, v := range src {
		if sm, ok := v.(map[string]any); ok {
			if dm, ok := dst[k].(map[string]any); ok {
				mergeTOML(dm, sm)
				continue
			}
		}
		dst[k] = v
	}
}

// ParseContainerdTree reads a decoded containerd config (version 1, 2 or 3).
func ParseContainerdTree(tree map[string]any) *ContainerdConfig {
	c := &ContainerdConfig{Runtimes: map[string]ContainerdRuntime{}, NRIPluginPath: "/opt/nri/plugins", NRIConfigPath: "/etc/nri/conf.d"}
	c.Version = int(asInt(tree["version"]))
	if c.Version == 0 {
		c.Version = 1
	}
	var cri map[string]any
	switch c.Version {
	case 3:
		cri = table(tree, "plugins", "io.containerd.cri.v1.runtime")
	case 2:
		cri = table(tree, "plugins", "io.containerd.grpc.v1.cri")
	default:
		cri = table(tree, "plugins", "cri")
	}
	ctrd := table(cri, "containerd")
	c.DefaultRuntime, _ = ctrd["default_runtime_name"].(string)
	if c.DefaultRuntime == "" {
		c.DefaultRuntime = "runc"
	}
	for name, v := range table(ctrd, "runtimes") {
		rt, _ := v.(map[string]any)
		r := ContainerdRuntime{Name: name}
		r.Type, _ = rt["runtime_type"].(string)
		r.BinaryName, _ = table(rt, "options")["BinaryName"].(string)
		r.PodAnnotations = asStrings(rt["pod_annotations"])
		r.ContainerAnnotations = asStrings(rt["container_annotations"])
		c.Runtimes[name] = r
	}
	if v, ok := cri["enable_cdi"].(bool); ok {
		c.CDIEnabled = &v
	} else if c.Version == 3 {
		t := true // containerd 2.x
		c.CDIEnabled = &t
	}
	nri, hasNRI := table(tree, "plugins")["io.containerd.nri.v1.nri"].(map[string]any)
	switch {
	case hasNRI:
		disabled, ok := nri["disable"].(bool)
		if !ok {
			disabled = c.Version < 3 // 1.7 ships it disabled
		}
		enabled := !disabled
		c.NRIEnabled = &enabled
		if p, ok := nri["plugin_path"].(string); ok && p != "" {
			c.NRIPluginPath = p
		}
		if p, ok := nri["plugin_config_path"].(string); ok && p != "" {
			c.NRIConfigPath = p
		}
		v := table(nri, "default_validator")
		c.NRIValidator.Enabled, _ = v["enable"].(bool)
		c.NRIValidator.RequiredPlugins = asStrings(v["required_plugins"])
		c.NRIValidator.TolerateAnnotation, _ = v["tolerate_missing_plugins_annotation"].(string)
	case c.Version == 3:
		t := true
		c.NRIEnabled = &t
	}
	return c
}

// CDIAnnotationPassthrough lists the runtimes whose pod_annotations let
// "cdi.k8s.io/…" pod annotations through to the OCI spec.
func (c *ContainerdConfig) CDIAnnotationPassthrough() []string {
	var out []string
	for name, r := range c.Runtimes {
		for _, pattern := range r.PodAnnotations {
			if passesCDIAnnotation(pattern) {
				out = append(out, name)
				break
			}
		}
	}
	sort.Strings(out)
	return out
}

// passesCDIAnnotation errs on the safe side: a pattern counts when it
// matches a cdi.k8s.io key as a path glob, starts with the CDI prefix, or
// is made of wildcards only (whether "*" crosses "/" depends on the
// containerd release).
func passesCDIAnnotation(pattern string) bool {
	if ok, _ := path.Match(pattern, "cdi.k8s.io/gpu"); ok {
		return true
	}
	return strings.HasPrefix(pattern, "cdi.k8s.io") || strings.Trim(pattern, "*/") == ""
}

// NVIDIAIsDefault says whether pods without a RuntimeClass run under the
// NVIDIA runtime.
func (c *ContainerdConfig) NVIDIAIsDefault() bool {
	if r, ok := c.Runtimes[c.DefaultRuntime]; ok {
		return r.IsNVIDIA()
	}
	return strings.HasPrefix(c.DefaultRuntime, "nvidia")
}

func table(m map[string]any, keys ...string) map[string]any {
	for _, k := range keys {
		next, ok := m[k].(map[string]any)
		if !ok {
			return map[string]any{}
		}
		m = next
	}
	return m
}

func asInt(v any) int64 {
	switch n := v.(type) {
	case int64:
		return n
	case float64:
		return int64(n)
	}
	return 0
}

func asStrings(v any) []string {
	list, _ := v.([]any)
	var out []string
	for _, e := range list {
		if s, ok := e.(string); ok {
			out = append(out, s)
		}
	}
	return out
}
