package strategy

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/gpuguard/gpuguard/internal/wellknown"
)

// Paths and names the toolkit understands.
const (
	VisibleDevicesEnv = "NVIDIA_VISIBLE_DEVICES"
	// VolumeMountRoot is where the toolkit looks for volume-mount device lists.
	VolumeMountRoot = "/var/run/nvidia-container-devices"
	// DefaultAnnotationPrefix is the prefix of CDI device annotations.
	DefaultAnnotationPrefix = cdi.AnnotationPrefix
)

// IDStrategy says how devices are named to the runtime.
type IDStrategy string

// Device ID strategies.
const (
	IDUUID  IDStrategy = "uuid"
	IDIndex IDStrategy = "index"
)

// ParseIDStrategy reads --device-id-strategy.
func ParseIDStrategy(s string) (IDStrategy, error) {
	switch IDStrategy(s) {
	case IDUUID, IDIndex:
		return IDStrategy(s), nil
	}
	return "", fmt.Errorf("device-id-strategy %q: want uuid or index", s)
}

// DeviceRef names one allocated device both ways.
type DeviceRef struct {
	UUID  string // GPU-… or MIG-…
	Index string // "3" or "0:2"
}

// Builder builds ContainerAllocateResponses.
type Builder struct {
	Strategies List
	IDs        IDStrategy
	// CDIKind is the kind of the CDI spec naming the devices, e.g.
	// "nvidia.com/gpu".
	CDIKind string
	// AnnotationPrefix replaces "cdi.k8s.io/" in annotation keys when set.
	AnnotationPrefix string
	// NewAllocationID returns a unique ID for a CDI annotation key; nil
	// means random.
	NewAllocationID func() string
}

func (b *Builder) id(d DeviceRef) string {
	if b.IDs == IDIndex {
		return d.Index
	}
	return d.UUID
}

// Build returns the response for one container's devices.
func (b *Builder) Build(devs []DeviceRef) (*pluginapi.ContainerAllocateResponse, error) {
	if len(devs) == 0 {
		return nil, fmt.Errorf("no devices")
	}
	ids := make([]string, len(devs))
	for i, d := range devs {
		ids[i] = b.id(d)
		if ids[i] == "" {
			return nil, fmt.Errorf("device %d has no %s ID", i, b.IDs)
		}
	}
	r := &pluginapi.ContainerAllocateResponse{}
	if b.Strategies.Has(EnvVar) {
		r.Envs = map[string]string{VisibleDevicesEnv: strings.Join(ids, ",")}
	}
	if b.Strategies.Has(VolumeMounts) {
		r.Envs = map[string]string{VisibleDevicesEnv: VolumeMountRoot}
		for _, id := range ids {
			r.Mounts = append(r.Mounts, &pluginapi.Mount{
				HostPath:      "/dev/null",
				ContainerPath: VolumeMountRoot + "/" + id,
				ReadOnly:      true,
			})
		}
	}
	if b.Strategies.UsesCDI() {
		if b.CDIKind == "" {
			return nil, fmt.Errorf("CDI strategy without a CDI kind")
		}
		names := make([]string, len(ids))
		for i, id := range ids {
			names[i] = b.CDIKind + "=" + id
		}
		if b.Strategies.Has(CDIAnnotations) {
			key, err := cdi.AnnotationKey(wellknown.Agent, b.allocationID())
			if err != nil {
				return nil, err
			}
			if b.AnnotationPrefix != "" {
				key = b.AnnotationPrefix + strings.TrimPrefix(key, cdi.AnnotationPrefix)
			}
			value, err := cdi.AnnotationValue(names)
			if err != nil {
				return nil, fmt.Errorf("CDI annotation: %w", err)
			}
			r.Annotations = map[string]string{key: value}
		}
		if b.Strategies.Has(CDICRI) {
			for _, n := range names {
				r.CdiDevices = append(r.CdiDevices, &pluginapi.CDIDevice{Name: n})
			}
		}
	}
	return r, nil
}

func (b *Builder) allocationID() string {
	if b.NewAllocationID != nil {
		return b.NewAllocationID()
	}
	var buf [8]byte
	_, _ = rand.Read(buf[:])
	return hex.EncodeToString(buf[:])
}
