package app

import (
	"context"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpuguard/gpuguard/agent/discovery"
	"github.com/gpuguard/gpuguard/agent/verifier"
	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/internal/kubeconfig"
)

// apiConfig is the agent's API access for Events, evictions and its
// ClusterReport: --kubeconfig, or the pod's service account in a cluster; nil
// outside one.
func apiConfig(path string) (*rest.Config, error) {
	if path == "" && os.Getenv("KUBERNETES_SERVICE_HOST") == "" {
		return nil, nil
	}
	cfg, err := kubeconfig.Flags{Path: path}.Load()
	if err != nil {
		return nil, fmt.Errorf("API access for the verifier: %w", err)
	}
	return cfg, nil
}

func readPolicy(path string) (*config.Policy, error) {
	p, err := config.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--policy-file: %w", err)
	}
	return p, nil
}

// startVerifier runs the node verifier in the session until it stops. The
// runtime and the kubelet may come up after the agent: it dials them on
// each pass until they answer.
func (a *Agent) startVerifier(ctx context.Context, s *session, inv *discovery.Inventory) {
	if a.cfg.Verify == verifier.ModeOff {
		return
	}
	interval := a.cfg.VerifyInterval
	rep := &verifier.Reporter{Mode: a.cfg.Verify, Log: a.log.WithName("verify"), Metrics: a.verifyMetrics}
	if a.reports != nil {
		rep.Node = &verifier.NodeReport{Client: a.reports, Node: a.cfg.NodeName, Nodes: a.kube}
	}
	table := verifier.NewDeviceTable(inv)
	if err := table.AddMIGCaps(a.cfg.ProcRoot, inv); err != nil {
		a.log.Error(err, "cannot map MIG capability nodes; MIG devices are judged by their parent GPU's node")
	}
	v := &verifier.Verifier{
		Table: table, Resolver: verifier.NewGPUResolver(inv),
		ProcRoot: a.cfg.ProcRoot,
		// NVML's process view: what each GPU has running, mapped to containers
		// by cgroup.
		Processes:  verifier.NVMLProcesses{Lib: a.backend.Lib, GPUs: inv.GPUs},
		Self:       verifier.ContainerKey{Namespace: os.Getenv("POD_NAMESPACE"), Pod: os.Getenv("POD_NAME")},
		Checkpoint: verifier.NewCheckpoint(a.cfg.DevicePluginDir),
	}
	if a.kube != nil {
		rep.Actions = verifier.Kube{Client: a.kube, Node: a.cfg.NodeName, Runtime: func() verifier.ContainerStopper {
			if cri, ok := v.Containers.(*verifier.CRI); ok {
				return cri
			}
			return nil
		}}
	}
	// The policy's exemptions, read again every pass; service accounts of
	// pods with findings are read from the API server and kept. Unqueued:
	// a read that failed behind a burst of Events would have an exempt
	// container's findings acted on.
	ex := &verifier.Exemptions{Client: a.unqueued}
	v.Exempt, v.Fraction = ex.OfGPUs, ex.KAIFraction
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer v.Close()
		a.log.Info("node verifier on", "mode", a.cfg.Verify, "interval", interval.String())
		t := time.NewTicker(interval)
		defer t.Stop()
		wake := make(chan struct{}, 1)
		for {
			err := a.connectVerifier(ctx, v, ex, wake)
			if err == nil {
				p, perr := v.Check(ctx)
				rep.Report(ctx, p, perr)
			} else {
				rep.Report(ctx, verifier.Pass{}, err)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			case <-wake:
			}
		}
	}()
}

// watchStarts passes container start events on to the verifier's loop, and
// subscribes again after the runtime restarts; a runtime without the events
// (Unimplemented) leaves the interval alone.
func (a *Agent) watchStarts(ctx context.Context, cri *verifier.CRI, wake chan<- struct{}) {
	for ctx.Err() == nil {
		err := cri.WatchStarts(ctx, wake)
		if ctx.Err() != nil {
			return
		}
		if status.Code(err) == codes.Unimplemented {
			a.log.Info("the runtime has no container events; the verifier looks every interval only")
			return
		}
		a.log.Info("container event stream ended; subscribing again", "reason", fmt.Sprint(err))
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
		}
	}
}

// connectVerifier dials what the verifier reads, if not yet connected, and
// reloads the policy's GPU resources and exemptions.
func (a *Agent) connectVerifier(ctx context.Context, v *verifier.Verifier, ex *verifier.Exemptions, wake chan<- struct{}) error {
	pol := a.verifierPolicy()
	v.IsGPUResource = pol.Spec.IsGPUResource
	ex.Set(pol, a.cfg.VerifyExemptNamespaces)
	if v.Allocations == nil {
		pr, err := verifier.DialPodResources(a.cfg.PodResourcesSocket)
		if err != nil {
			return err
		}
		v.Allocations = pr
	}
	if v.Containers == nil {
		endpoint := a.cfg.CRIEndpoint
		if endpoint == "" {
			found, err := verifier.FindCRISocket(a.cfg.HostRoot)
			if err != nil {
				return err
			}
			endpoint = found
		}
		cri, err := verifier.DialCRI(ctx, endpoint)
		if err != nil {
			return err
		}
		v.Containers = cri
		if a.cfg.VerifyContainerEvents {
			go a.watchStarts(ctx, cri, wake)
		}
	}
	return nil
}

// apiClients makes the agent's clients: kube for Events and evictions,
// reports with --reports for its ClusterReport, and unqueued for what must
// not wait behind those. What needs API access refuses to run without it.
//
// kube keeps client-go's client-side rate limit (5 calls a second, bursts
// of 10), and tenants drive how many Events the agent writes, one for each
// container the enforcer changes. unqueued has no client-side limit: a
// container's creation waits on the enforcer's read of its pod (for its
// service account's exemption) within 1.5 s, and the node counts as
// covered only while its Leases are renewed; queued behind a burst of
// Events, the read failed and an exempt container was judged, by the
// enforcer and the verifier, as though it were not, and a renewal could
// be late. The API server's priority and fairness still bounds them, and
// a pod is read once.
func apiClients(cfg Config) (kube, unqueued kubernetes.Interface, reports dynamic.Interface, err error) {
	rc, err := apiConfig(cfg.Kubeconfig)
	switch {
	case err != nil:
		return nil, nil, nil, err
	case rc == nil && cfg.Verify == verifier.ModeEnforce:
		return nil, nil, nil, fmt.Errorf("--verify=enforce deletes pods through the API server: run in a cluster or pass --kubeconfig")
	case rc == nil && cfg.Reports:
		return nil, nil, nil, fmt.Errorf("--reports writes a ClusterReport through the API server: run in a cluster or pass --kubeconfig")
	case rc == nil:
		return nil, nil, nil, nil
	}
	if kube, err = kubernetes.NewForConfig(rc); err != nil {
		return nil, nil, nil, err
	}
	free := rest.CopyConfig(rc)
	free.QPS, free.Burst, free.RateLimiter = -1, 0, nil
	if unqueued, err = kubernetes.NewForConfig(free); err != nil || !cfg.Reports {
		return kube, unqueued, nil, err
	}
	reports, err = dynamic.NewForConfig(rc)
	return kube, unqueued, reports, err
}

// verifierPolicy is the policy the verifier judges by: the file's, read again
// every pass, or while it cannot be read or is invalid (a typo, a field of a
// newer gpuguard, a ConfigMap not created yet) the last one read, and the
// built-in policy before any. Each new problem is logged once.
func (a *Agent) verifierPolicy() *config.Policy {
	if a.cfg.PolicyFile == "" {
		return config.Default()
	}
	p, err := readPolicy(a.cfg.PolicyFile)
	a.policyMu.Lock()
	defer a.policyMu.Unlock()
	if err == nil {
		if a.policyErr != "" {
			a.log.Info("the policy file reads again", "file", a.cfg.PolicyFile)
		}
		a.lastPolicy, a.policyErr = p, ""
		return p
	}
	if err.Error() != a.policyErr {
		a.log.Error(err, "cannot use the policy file; the verifier keeps the last policy it read (the built-in one before any)")
	}
	a.policyErr = err.Error()
	if a.lastPolicy != nil {
		return a.lastPolicy
	}
	return config.Default()
}
