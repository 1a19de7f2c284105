package verifier

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpuguard/gpuguard/agent/discovery"
	"github.com/gpuguard/gpuguard/internal/dra"
)

// DefaultPodResourcesSocket is where the kubelet serves its PodResources API.
const DefaultPodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// ContainerKey names a container the way both the kubelet and the CRI do.
type ContainerKey struct {
	Namespace, Pod, Container string
}

func (k ContainerKey) String() string { return k.Namespace + "/" + k.Pod + "/" + k.Container }

// Allocations are the device IDs the kubelet allocated to each container,
// per resource name.
type Allocations map[ContainerKey]map[string][]string

// AllocationSource reports what the kubelet allocated.
type AllocationSource interface {
	Allocations(ctx context.Context) (Allocations, error)
}

// PodResources reads allocations from the kubelet's PodResources API (List)
// over its unix socket.
type PodResources struct {
	client podresourcesapi.PodResourcesListerClient
	conn   *grpc.ClientConn
	// getUnsupported: the kubelet refused Get once; list from then on.
	getUnsupported atomic.Bool
	// pace keeps this client's calls within the kubelet's rate.
	pace *rate.Limiter
}

// The kubelet serves PodResources at most kubeletQPS calls a second, in
// bursts of at most kubeletBurst, across all its clients on the node; it
// turns the rest away with ResourceExhausted ("rejected by rate limit",
// k8s.io/kubernetes pkg/kubelet/apis/podresources/constants.go and
// pkg/kubelet/apis/grpc/ratelimit.go). The enforcer reads once for each
// container it creates, and a node starting many pods at once would
// otherwise have the kubelet's refusals become refused containers.
const (
	kubeletQPS   = 100
	kubeletBurst = 10
)

// Backoff after the kubelet turned a call away for its rate: another
// client used its budget. The kubelet's budget refills a call every 10 ms.
const (
	rateRetryFirst = 5 * time.Millisecond
	rateRetryMax   = 40 * time.Millisecond
)

// DialPodResources connects to the kubelet's PodResources socket. The
// connection is lazy: a kubelet not up yet is an error of the first List.
func DialPodResources(socket string) (*PodResources, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("the kubelet's PodResources socket %s: %w", socket, err)
	}
	return &PodResources{client: podresourcesapi.NewPodResourcesListerClient(conn), conn: conn,
		pace: rate.NewLimiter(kubeletQPS, kubeletBurst)}, nil
}

// withinRate makes one call to the kubelet within its rate: queued on this
// side at the kubelet's own rate, so that this client's bursts wait their
// turn rather than being turned away, and tried again while the kubelet
// turns it away for its rate, which other clients share, until ctx ends.
func withinRate[T any](ctx context.Context, p *PodResources, call func(context.Context) (T, error)) (T, error) {
	var zero T
	backoff := rateRetryFirst
	for {
		if err := p.pace.Wait(ctx); err != nil {
			return zero, fmt.Errorf("waiting for a turn within the kubelet's PodResources rate (%d calls a second): %w", kubeletQPS, err)
		}
		v, err := call(ctx)
		if status.Code(err) != codes.ResourceExhausted {
			return v, err
		}
		select {
		case <-ctx.Done():
			return zero, fmt.Errorf("the kubelet kept turning the call away for its rate until %w: %w", ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, rateRetryMax)
	}
}

// Close closes the connection.
func (p *PodResources) Close() error { return p.conn.Close() }

// Allocations lists every container's devices, including DRA claims'
// devices where the kubelet reports them (as "driver/pool/device").
func (p *PodResources) Allocations(ctx context.Context) (Allocations, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := withinRate(ctx, p, func(ctx context.Context) (*podresourcesapi.ListPodResourcesResponse, error) {
		return p.client.List(ctx, &podresourcesapi.ListPodResourcesRequest{})
	})
	if err != nil {
		return nil, fmt.Errorf("listing the kubelet's pod resources: %w", err)
	}
	out := Allocations{}
	for _, pod := range resp.GetPodResources() {
		addPod(out, pod)
	}
	return out, nil
}

// PodAllocationSource reads one pod's allocations, cheaper than listing
// every pod's where the kubelet can.
type PodAllocationSource interface {
	PodAllocations(ctx context.Context, namespace, pod string) (Allocations, error)
}

// PodAllocations reads one pod's devices with the PodResources Get method
// (on by default from Kubernetes 1.34, GA in 1.36), which costs the kubelet
// one pod rather than all. Where the kubelet refuses Get (older, or the
// feature gate off) it lists, and keeps listing from then on.
func (p *PodResources) PodAllocations(ctx context.Context, namespace, pod string) (Allocations, error) {
	if !p.getUnsupported.Load() {
		resp, err := withinRate(ctx, p, func(ctx context.Context) (*podresourcesapi.GetPodResourcesResponse, error) {
			return p.client.Get(ctx, &podresourcesapi.GetPodResourcesRequest{PodNamespace: namespace, PodName: pod})
		})
		if err == nil {
			out := Allocations{}
			addPod(out, resp.GetPodResources())
			return out, nil
		}
		if podUnknown(err) {
			// Not the kubelet's pod (another CRI client's): nothing
			// allocated to it, as a List would have said.
			return Allocations{}, nil
		}
		if !getUnsupported(err) {
			return nil, fmt.Errorf("reading the kubelet's resources of pod %s/%s: %w", namespace, pod, err)
		}
		p.getUnsupported.Store(true)
	}
	return p.Allocations(ctx)
}

// getUnsupported: the kubelet has no Get (Unimplemented), or has it off
// ("PodResources API Get method disabled", an Unknown error).
func getUnsupported(err error) bool {
	st, _ := status.FromError(err)
	return st.Code() == codes.Unimplemented || strings.Contains(st.Message(), "Get method disabled")
}

// podUnknown: the kubelet has no such pod ("pod X in namespace Y not
// found", an Unknown error; NotFound from a kubelet that codes it).
func podUnknown(err error) bool {
	st, _ := status.FromError(err)
	return st.Code() == codes.NotFound || strings.HasSuffix(st.Message(), " not found")
}

// DRAResourcePrefix and DRACDIResourcePrefix key, in an Allocations entry,
// a container's claimed devices of an NVIDIA DRA driver: "dra:<driver>"
// lists their device names, "dra-cdi:<driver>" the fully qualified CDI
// devices the kubelet hands the runtime for them. No resource name of a
// device plugin has either form (an extended resource is
// "<domain>/<name>").
const (
	DRAResourcePrefix    = "dra:"
	DRACDIResourcePrefix = "dra-cdi:"
)

// addPod adds a pod's containers' devices to out.
func addPod(out Allocations, pod *podresourcesapi.PodResources) {
	for _, c := range pod.GetContainers() {
		byResource := map[string][]string{}
		for _, d := range c.GetDevices() {
			byResource[d.GetResourceName()] = append(byResource[d.GetResourceName()], d.GetDeviceIds()...)
		}
		for _, dr := range c.GetDynamicResources() {
			for _, res := range dr.GetClaimResources() {
				// Only NVIDIA's DRA drivers name GPUs.
				if !dra.NVIDIADriver(res.GetDriverName()) {
					continue
				}
				name := DRAResourcePrefix + res.GetDriverName()
				byResource[name] = append(byResource[name], res.GetDeviceName())
				for _, d := range res.GetCdiDevices() {
					cdi := DRACDIResourcePrefix + res.GetDriverName()
					byResource[cdi] = append(byResource[cdi], d.GetName())
				}
			}
		}
		out[ContainerKey{pod.GetNamespace(), pod.GetName(), c.GetName()}] = byResource
	}
}

// GPUResolver turns the device IDs of an allocation into the UUIDs of the
// GPUs whose device nodes they open: a full GPU's UUID or index, a MIG
// device's UUID (its parent's node and its own capability nodes) or
// "<gpu>:<mig>" index (its parent's node), a shared
// replica's "<id>::<n>", and a DRA device named after one of those.
type GPUResolver struct {
	byID map[string]string
	// byMinor maps a GPU's device node minor to its UUID: the DRA driver
	// names GPUs by minor.
	byMinor map[int]string
	// mig maps "<parent UUID>/<MIG UUID>" to the MIG UUID, for IDs that name a
	// MIG device, so that its capability nodes are allowed too.
	mig map[string]string
}

// NewGPUResolver indexes the inventory.
func NewGPUResolver(inv *discovery.Inventory) *GPUResolver {
	r := &GPUResolver{byID: map[string]string{}, byMinor: map[int]string{}, mig: map[string]string{}}
	for _, g := range inv.GPUs {
		r.byID[g.UUID] = g.UUID
		r.byMinor[g.Minor] = g.UUID
		r.byID[strconv.Itoa(g.Index)] = g.UUID
		for _, m := range g.MIG {
			r.byID[m.UUID] = g.UUID
			r.byID[m.IndexID()] = g.UUID
			r.mig[g.UUID+"/"+m.UUID] = m.UUID
			r.mig[g.UUID+"/"+m.IndexID()] = m.UUID
		}
	}
	return r
}

// GPUs resolves the device IDs of the resources that isGPU accepts; IDs it
// does not know are skipped (another vendor's, say).
func (r *GPUResolver) GPUs(byResource map[string][]string, isGPU func(string) bool) map[string]bool {
	out := map[string]bool{}
	for resource, ids := range byResource {
		claimed := strings.HasPrefix(resource, DRAResourcePrefix)
		if !claimed && !isGPU(resource) {
			continue
		}
		for _, id := range ids {
			id, _, _ = strings.Cut(id, "::")
			if uuid, ok := r.byID[id]; ok {
				out[uuid] = true
				if mig, ok := r.mig[uuid+"/"+id]; ok {
					out[mig] = true
				}
			} else if claimed {
				if uuid, ok := r.byDRAName(id); ok {
					out[uuid] = true
				}
			}
		}
	}
	return out
}

// Unknown lists the device IDs of the resources that isGPU accepts that
// name no GPU or MIG device of the inventory (after a replica's "::<n>"):
// an allocation in a scheme the resolver does not know, such as a sharing
// scheduler's "<uuid>-_-<n>".
func (r *GPUResolver) Unknown(byResource map[string][]string, isGPU func(string) bool) []string {
	var out []string
	for resource, ids := range byResource {
		if strings.HasPrefix(resource, DRAResourcePrefix) || !isGPU(resource) {
			continue
		}
		for _, id := range ids {
			if base, _, _ := strings.Cut(id, "::"); r.byID[base] == "" {
				out = append(out, id)
			}
		}
	}
	slices.Sort(out)
	return out
}

// byDRAName matches the NVIDIA DRA driver's device names, "gpu-<minor>" and
// "gpu-<minor>-mig-...", to the GPU of that device node minor.
func (r *GPUResolver) byDRAName(name string) (string, bool) {
	minor, _, ok := dra.ParseGPUDevice(name)
	if !ok {
		return "", false
	}
	uuid, ok := r.byMinor[minor]
	return uuid, ok
}
