package verifier

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	internalapi "k8s.io/cri-api/pkg/apis"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	remote "k8s.io/cri-client/pkg"
)

// The labels the kubelet puts on every container it creates through the CRI.
const (
	labelPodName       = "io.kubernetes.pod.name"
	labelPodNamespace  = "io.kubernetes.pod.namespace"
	labelPodUID        = "io.kubernetes.pod.uid"
	labelContainerName = "io.kubernetes.container.name"
)

// CRISockets are the runtime sockets the agent looks for under the host
// root, in order: containerd (also k3s and RKE2's), then CRI-O.
var CRISockets = []string{
	"/run/containerd/containerd.sock",
	"/run/k3s/containerd/containerd.sock",
	"/var/run/crio/crio.sock",
}

// FindCRISocket returns the first of CRISockets present under hostRoot.
func FindCRISocket(hostRoot string) (string, error) {
	for _, s := range CRISockets {
		p := filepath.Join(hostRoot, s)
		if info, err := os.Stat(p); err == nil && info.Mode()&os.ModeSocket != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("no CRI socket under %s (looked for %v); pass --cri-endpoint", hostRoot, CRISockets)
}

// Container is one running container of a pod, as the runtime reports it.
type Container struct {
	ID     string
	Key    ContainerKey
	PodUID string
	PID    int
}

// ContainerSource lists the node's running containers.
type ContainerSource interface {
	Running(ctx context.Context) ([]Container, error)
}

// CRI lists running containers through the node's CRI runtime service. A
// container's PID comes from its verbose status, asked once per container:
// it does not change while the container runs.
type CRI struct {
	rs internalapi.RuntimeService

	mu   sync.Mutex
	pids map[string]int
}

// DialCRI connects to a CRI endpoint ("unix:///run/containerd/containerd.sock"
// or a bare socket path).
func DialCRI(ctx context.Context, endpoint string) (*CRI, error) {
	if filepath.IsAbs(endpoint) {
		endpoint = "unix://" + endpoint
	}
	// No tracing: the agent exports none.
	rs, err := remote.NewRemoteRuntimeServiceBuilder().WithEndpoint(endpoint).
		WithConnectionTimeout(10 * time.Second).WithTracerProvider(nil).Build(ctx)
	if err != nil {
		return nil, fmt.Errorf("the CRI runtime at %s: %w", endpoint, err)
	}
	return &CRI{rs: rs, pids: map[string]int{}}, nil
}

// Running lists the running containers that the kubelet created.
func (c *CRI) Running(ctx context.Context) ([]Container, error) {
	list, err := c.rs.ListContainers(ctx, &runtimeapi.ContainerFilter{
		State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}})
	if err != nil {
		return nil, fmt.Errorf("listing containers through the CRI: %w", err)
	}
	live := make(map[string]bool, len(list))
	var out []Container
	var pidErr error
	for _, ct := range list {
		l := ct.GetLabels()
		if l[labelPodName] == "" || l[labelContainerName] == "" {
			continue // not the kubelet's
		}
		live[ct.GetId()] = true
		pid, err := c.pid(ctx, ct.GetId())
		if err != nil {
			pidErr = err // stopped meanwhile, most likely; the next pass sees it gone
			continue
		}
		out = append(out, Container{ID: ct.GetId(), PID: pid, PodUID: l[labelPodUID],
			Key: ContainerKey{Namespace: l[labelPodNamespace], Pod: l[labelPodName], Container: l[labelContainerName]}})
	}
	c.forget(live)
	// Not one PID: a runtime whose status the agent cannot read would
	// otherwise look like a node with nothing running.
	if len(out) == 0 && pidErr != nil {
		return nil, fmt.Errorf("no running container's PID could be read from the runtime: %w", pidErr)
	}
	return out, nil
}

func (c *CRI) pid(ctx context.Context, id string) (int, error) {
	c.mu.Lock()
	pid, ok := c.pids[id]
	c.mu.Unlock()
	if ok {
		return pid, nil
	}
	st, err := c.rs.ContainerStatus(ctx, id, true)
	if err != nil {
		return 0, err
	}
	pid, err = pidFromInfo(st.GetInfo())
	if err != nil {
		return 0, fmt.Errorf("container %s: %w", id, err)
	}
	c.mu.Lock()
	c.pids[id] = pid
	c.mu.Unlock()
	return pid, nil
}

// pidFromInfo reads the PID from a verbose container status: containerd and
// CRI-O both put a JSON document with "pid" under "info".
func pidFromInfo(info map[string]string) (int, error) {
	var doc struct {
		PID int `json:"pid"`
	}
	raw, ok := info["info"]
	if !ok {
		return 0, fmt.Errorf("the runtime's verbose status has no info")
	}
	if err := json.Unmarshal([]byte(raw), &doc); err != nil {
		return 0, fmt.Errorf("the runtime's verbose status info: %w", err)
	}
	if doc.PID <= 0 {
		return 0, fmt.Errorf("the runtime's verbose status names no pid")
	}
	return doc.PID, nil
}

func (c *CRI) forget(live map[string]bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id := range c.pids {
		if !live[id] {
			delete(c.pids, id)
		}
	}
}

// StopContainer stops a container at once: a timeout of 0 is SIGKILL, with
// no grace for a process that ignores SIGTERM.
func (c *CRI) StopContainer(ctx context.Context, id string) error {
	return c.rs.StopContainer(ctx, id, 0)
}

// Close closes the connection to the runtime.
func (c *CRI) Close() error {
	if closer, ok := c.rs.(interface{ Close(context.Context) error }); ok {
		return closer.Close(context.Background())
	}
	return nil
}

// WatchStarts wakes the verifier (a non-blocking send on wake) whenever the
// runtime reports a container started, so that a new container is looked at
// at once rather than at the next interval. It returns when ctx ends or the
// runtime ends the stream; a runtime without container events (CRI-O before
// evented PLEG, older containerd) answers at once with Unimplemented, and the
// interval alone drives the verifier then.
func (c *CRI) WatchStarts(ctx context.Context, wake chan<- struct{}) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := make(chan *runtimeapi.ContainerEventResponse, 64)
	// The reader drains until the stream has ended, so that the library's
	// blocking send never outlives it.
	ended := make(chan struct{})
	go func() {
		for {
			select {
			case <-ended:
				return
			case e := <-events:
				if e.GetContainerEventType() == runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT {
					select {
					case wake <- struct{}{}:
					default: // a pass is due already
					}
				}
			}
		}
	}()
	err := c.rs.GetContainerEvents(ctx, events, nil)
	close(ended)
	return err
}
