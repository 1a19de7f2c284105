// Package strategy decides how an allocated GPU reaches a container (the
// device-list strategy) and builds the kubelet's ContainerAllocateResponse.
package strategy

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gpuguard/gpuguard/agent/nodereport"
)

// Strategy is one device-list strategy.
type Strategy string

// The device-list strategies.
const (
	EnvVar         Strategy = "envvar"
	VolumeMounts   Strategy = "volume-mounts"
	CDIAnnotations Strategy = "cdi-annotations"
	CDICRI         Strategy = "cdi-cri"
	// Auto picks from the node's toolkit configuration.
	Auto = "auto"
)

var known = []Strategy{EnvVar, VolumeMounts, CDIAnnotations, CDICRI}

// List is a set of strategies, in a fixed order.
type List []Strategy

// Has reports whether s is in the list.
func (l List) Has(s Strategy) bool { return slices.Contains(l, s) }

// OnlyCDI is true when every strategy is a CDI one: no env var is emitted.
func (l List) OnlyCDI() bool {
	for _, s := range l {
		if s != CDIAnnotations && s != CDICRI {
			return false
		}
	}
	return len(l) > 0
}

// UsesCDI is true when some strategy names CDI devices.
func (l List) UsesCDI() bool { return l.Has(CDIAnnotations) || l.Has(CDICRI) }

func (l List) String() string {
	s := make([]string, len(l))
	for i, x := range l {
		s[i] = string(x)
	}
	return strings.Join(s, ",")
}

// Parse reads a comma list of strategies. "auto" alone returns nil, nil.
func Parse(s string) (List, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == Auto {
		return nil, nil
	}
	var l List
	for _, part := range strings.Split(s, ",") {
		st := Strategy(strings.TrimSpace(part))
		if st == Auto {
			return nil, fmt.Errorf("device-list strategy %q: auto cannot be combined with others", s)
		}
		if !slices.Contains(known, st) {
			return nil, fmt.Errorf("device-list strategy %q: unknown %q (want a list of %s, or auto)", s, st, List(known))
		}
		if !l.Has(st) {
			l = append(l, st)
		}
	}
	if l.Has(EnvVar) && l.Has(VolumeMounts) {
		return nil, fmt.Errorf("device-list strategy %q: envvar and volume-mounts both set NVIDIA_VISIBLE_DEVICES; choose one", s)
	}
	slices.SortFunc(l, func(a, b Strategy) int { return slices.Index(known, a) - slices.Index(known, b) })
	return l, nil
}

// Choice is the resolved strategy list and why.
type Choice struct {
	List   List
	Reason string
	// Warning is set when GPUs are handed out through a channel pods can
	// forge, or when the node configuration could not be checked.
	Warning string
}

// Resolve turns --device-list-strategy into a list, checking it against
// the node's toolkit (tk) and containerd (ctrd) configuration; either may
// be nil when not found. A strategy the node would ignore, whether given
// explicitly or the only one auto could pick, is an error that names the
// setting to change: GPU pods would otherwise start without their GPUs.
func Resolve(flag string, tk *nodereport.ToolkitConfig, ctrd *nodereport.ContainerdConfig) (Choice, error) {
	l, err := Parse(flag)
	if err != nil {
		return Choice{}, err
	}
	var c Choice
	if l == nil {
		c, err = auto(tk, ctrd)
		if err != nil {
			return Choice{}, err
		}
	} else {
		c = Choice{List: l, Reason: "--device-list-strategy=" + l.String()}
	}
	if tk == nil {
		if c.Warning == "" {
			c.Warning = "NVIDIA Container Toolkit config not found: cannot check that the runtime honours " + c.List.String()
		}
		return c, nil
	}
	if err := refuseIgnored(c.List, tk, ctrd); err != nil {
		return Choice{}, err
	}
	c.Warning = hardeningWarning(c.List, tk)
	return c, nil
}

// refuseIgnored returns an error when the runtime would ignore every
// channel in l.
func refuseIgnored(l List, tk *nodereport.ToolkitConfig, ctrd *nodereport.ContainerdConfig) error {
	if l.Has(VolumeMounts) && !tk.AcceptVolumeMounts {
		return fmt.Errorf("device-list strategy volume-mounts: the toolkit ignores volume-mount device lists, so GPU pods would get no GPU: set %s = true in %s, or choose another strategy", nodereport.KeyAcceptVolumeMounts, tk.Path)
	}
	if l.Has(EnvVar) && !l.UsesCDI() && !tk.AcceptEnvvarUnprivileged {
		return fmt.Errorf("device-list strategy envvar: the toolkit ignores NVIDIA_VISIBLE_DEVICES from unprivileged containers (%s = false in %s), so GPU pods would get no GPU: use volume-mounts (set %s = true) or CDI", nodereport.KeyAcceptEnvvarUnprivileged, tk.Path, nodereport.KeyAcceptVolumeMounts)
	}
	if !l.UsesCDI() || !containerdCDIOff(ctrd) {
		return nil
	}
	if l.Has(CDICRI) {
		return fmt.Errorf("device-list strategy cdi-cri: containerd does not apply CDI devices: set enable_cdi = true in the CRI plugin section of %s", strings.Join(ctrd.Paths, ", "))
	}
	if !runtimePassesCDIAnnotations(ctrd) {
		return fmt.Errorf("device-list strategy cdi-annotations: neither containerd (enable_cdi = false in %s) nor the NVIDIA runtime (no container_annotations for cdi.k8s.io/*) applies CDI annotations: set enable_cdi = true", strings.Join(ctrd.Paths, ", "))
	}
	return nil
}

// hardeningWarning says how far a node serving l through tk is from
// hardened; "" when it is.
func hardeningWarning(l List, tk *nodereport.ToolkitConfig) string {
	switch {
	case l.Has(EnvVar) && !l.UsesCDI():
		return "NODE NOT HARDENED: GPUs are handed out through NVIDIA_VISIBLE_DEVICES, which pods can forge: set " + nodereport.KeyAcceptVolumeMounts + " = true and " + nodereport.KeyAcceptEnvvarUnprivileged + " = false in " + tk.Path
	case tk.AcceptEnvvarUnprivileged:
		return "node not fully hardened: the toolkit still accepts NVIDIA_VISIBLE_DEVICES from unprivileged containers: set " + nodereport.KeyAcceptEnvvarUnprivileged + " = false in " + tk.Path
	}
	return ""
}

// auto picks the strategy the node's runtime honours, preferring the
// channels pods cannot forge.
func auto(tk *nodereport.ToolkitConfig, ctrd *nodereport.ContainerdConfig) (Choice, error) {
	cdi := List{CDIAnnotations, CDICRI}
	if containerdCDIOff(ctrd) {
		cdi = List{CDIAnnotations}
	}
	switch {
	case tk == nil:
		return Choice{List: List{EnvVar}, Reason: "auto: no NVIDIA Container Toolkit config found",
			Warning: "NODE NOT HARDENED: no toolkit config found, falling back to envvar, which pods can forge; pass --toolkit-config or configure the toolkit"}, nil
	case tk.RuntimeMode == "cdi":
		return Choice{List: cdi, Reason: "auto: the NVIDIA runtime is in CDI mode (" + tk.Path + ")"}, nil
	case tk.AcceptVolumeMounts:
		return Choice{List: List{VolumeMounts}, Reason: "auto: the toolkit accepts volume-mount device lists (" + tk.Path + ")"}, nil
	case tk.AcceptEnvvarUnprivileged:
		return Choice{List: List{EnvVar}, Reason: "auto: the toolkit accepts neither volume mounts nor CDI (" + tk.Path + ")"}, nil
	case ctrd != nil && ctrd.CDIEnabled != nil && *ctrd.CDIEnabled:
		// The toolkit honours no channel of its own, but containerd
		// injects CDI devices itself.
		return Choice{List: cdi, Reason: "auto: the toolkit rejects the env var and volume mounts, and containerd applies CDI devices (" + strings.Join(ctrd.Paths, ", ") + ")"}, nil
	}
	return Choice{}, fmt.Errorf("device-list strategy auto: the node honours no device list: the toolkit rejects NVIDIA_VISIBLE_DEVICES from unprivileged containers and volume mounts, its runtime is not in CDI mode (%s), and containerd is not known to apply CDI devices: set %s = true, or mode = \"cdi\", or enable_cdi = true in containerd", tk.Path, nodereport.KeyAcceptVolumeMounts)
}

// containerdCDIOff is true when containerd's config turns CDI off.
func containerdCDIOff(ctrd *nodereport.ContainerdConfig) bool {
	return ctrd != nil && ctrd.CDIEnabled != nil && !*ctrd.CDIEnabled
}

func runtimePassesCDIAnnotations(c *nodereport.ContainerdConfig) bool {
	for _, r := range c.Runtimes {
		if !r.IsNVIDIA() {
			continue
		}
		for _, p := range r.ContainerAnnotations {
			if strings.HasPrefix(p, "cdi.k8s.io") || strings.Trim(p, "*/") == "" {
				return true
			}
		}
	}
	return false
}
