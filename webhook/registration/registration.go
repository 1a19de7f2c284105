// Package registration registers gpuguard's webhook configurations from the
// webhook itself, once a replica serves: before that the API server has no
// webhook to call, so an install whose webhook never comes up (an image that
// cannot be pulled) guards nothing and blocks nothing, and a failed install
// leaves no configuration behind.
package registration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpuguard/gpuguard/internal/wellknown"
)

// Registrar applies the webhook configurations of File (manager.Runnable)
// once the webhook's Service has a ready endpoint: a replica that has its
// certificate, its policy, and answers TLS.
type Registrar struct {
	// File holds the MutatingWebhookConfiguration and the
	// ValidatingWebhookConfiguration, as YAML documents (the chart renders
	// them into a ConfigMap mounted here).
	File string
	// MutatingConfig and ValidatingConfig are the only names File may hold:
	// what the webhook's grants let it write.
	MutatingConfig, ValidatingConfig string
	// Service is the webhook's Service, whose EndpointSlices say when a
	// replica is ready.
	Service types.NamespacedName
	// Owner names the ClusterRole whose deletion (helm uninstall)
	// garbage-collects the configurations; empty: none.
	Owner string
	// Client applies; Reader reads the owner straight from the API server;
	// Clientset watches EndpointSlices.
	Client    client.Client
	Reader    client.Reader
	Clientset kubernetes.Interface
	// Then runs once the configurations are applied (the pre-filter, which
	// patches them, needs them to exist).
	Then func(context.Context)
	Log  logr.Logger

	registered chan struct{}
}

// NewRegistrar returns r ready to start.
func NewRegistrar(r Registrar) *Registrar {
	r.registered = make(chan struct{})
	return &r
}

// Registered fails until the configurations are applied (a readiness
// check): a controller that is ready has registered them, so helm install
// --wait returns only once the webhook is called.
func (r *Registrar) Registered(*http.Request) error {
	select {
	case <-r.registered:
		return nil
	default:
		return errors.New("the webhook configurations are not registered yet")
	}
}

// Load reads and checks the configurations of file: only a
// MutatingWebhookConfiguration named mutating and a
// ValidatingWebhookConfiguration named validating, each well formed.
func Load(file, mutating, validating string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("reading the webhook configurations: %w", err)
	}
	want := map[string]string{"MutatingWebhookConfiguration": mutating, "ValidatingWebhookConfiguration": validating}
	var objs []*unstructured.Unstructured
	seen := map[string]bool{}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for i := 1; ; i++ {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", file, i, err)
		}
		if len(u.Object) == 0 {
			continue
		}
		kind, name := u.GetKind(), u.GetName()
		if u.GetAPIVersion() != admissionregistrationv1.SchemeGroupVersion.String() || want[kind] == "" {
			return nil, fmt.Errorf("%s: document %d is %s %s; want a MutatingWebhookConfiguration and a ValidatingWebhookConfiguration of %s",
				file, i, u.GetAPIVersion(), kind, admissionregistrationv1.SchemeGroupVersion)
		}
		if name != want[kind] {
			return nil, fmt.Errorf("%s: %s %q: the webhook registers only %q", file, kind, name, want[kind])
		}
		if seen[kind] {
			return nil, fmt.Errorf("%s: a second %s", file, kind)
		}
		if err := checkTyped(u); err != nil {
			return nil, fmt.Errorf("%s: %s %s: %w", file, kind, name, err)
		}
		seen[kind] = true
		objs = append(objs, u)
	}
	if len(objs) == 0 {
		return nil, fmt.Errorf("%s holds no webhook configuration", file)
	}
	return objs, nil
}

// checkTyped decodes u strictly into its type: a misspelt field is an error
// here rather than a field the API server drops.
func checkTyped(u *unstructured.Unstructured) error {
	var typed any = &admissionregistrationv1.MutatingWebhookConfiguration{}
	if u.GetKind() == "ValidatingWebhookConfiguration" {
		typed = &admissionregistrationv1.ValidatingWebhookConfiguration{}
	}
	return runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, typed, true)
}

// Start waits for a ready replica, then applies the configurations,
// retrying until they land. It applies them once per start: a
// configuration deleted by hand, the runbook's step when a webhook blocks a
// cluster, stays deleted until the next restart.
func (r *Registrar) Start(ctx context.Context) error {
	objs, err := Load(r.File, r.MutatingConfig, r.ValidatingConfig)
	if err != nil {
		return err
	}
	r.Log.Info("waiting for a ready replica before registering the webhook configurations", "service", r.Service)
	if err := r.waitReadyEndpoint(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("waiting for a ready endpoint of Service %s: %w", r.Service, err)
	}
	backoff := wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Cap: 30 * time.Second, Steps: math.MaxInt32}
	err = wait.ExponentialBackoffWithContext(ctx, backoff, func(ctx context.Context) (bool, error) {
		if err := r.apply(ctx, objs); err != nil {
			r.Log.Error(err, "webhook configurations not registered; retrying")
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return nil // stopped
	}
	r.Log.Info("webhook configurations registered", "mutating", r.MutatingConfig, "validating", r.ValidatingConfig)
	close(r.registered)
	if r.Then != nil {
		r.Then(ctx)
	}
	<-ctx.Done()
	return nil
}

// NeedLeaderElection: every replica applies the same content, idempotently.
func (r *Registrar) NeedLeaderElection() bool { return false }

// waitReadyEndpoint returns once one of the Service's EndpointSlices has a
// ready endpoint.
func (r *Registrar) waitReadyEndpoint(ctx context.Context) error {
	selector := discoveryv1.LabelServiceName + "=" + r.Service.Name
	slices := r.Clientset.DiscoveryV1().EndpointSlices(r.Service.Namespace)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			return slices.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			return slices.Watch(ctx, o)
		},
	}
	_, err := watchtools.UntilWithSync(ctx, lw, &discoveryv1.EndpointSlice{}, nil, func(e watch.Event) (bool, error) {
		s, ok := e.Object.(*discoveryv1.EndpointSlice)
		return ok && e.Type != watch.Deleted && hasReadyEndpoint(s), nil
	})
	return err
}

func hasReadyEndpoint(s *discoveryv1.EndpointSlice) bool {
	for _, ep := range s.Endpoints {
		if ep.Conditions.Ready != nil && *ep.Conditions.Ready {
			return true
		}
	}
	return false
}

// apply applies each configuration server-side, owned by the Owner: the
// CA bundle, which cert-controller or cert-manager injects, and the
// pre-filter's match condition are other managers' fields and stay.
func (r *Registrar) apply(ctx context.Context, objs []*unstructured.Unstructured) error {
	var owners []metav1.OwnerReference
	if r.Owner != "" {
		role := &rbacv1.ClusterRole{}
		if err := r.Reader.Get(ctx, client.ObjectKey{Name: r.Owner}, role); err != nil {
			return fmt.Errorf("looking up the owner of the webhook configurations, ClusterRole %s: %w", r.Owner, err)
		}
		owners = []metav1.OwnerReference{{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole", Name: role.Name, UID: role.UID}}
	}
	for _, o := range objs {
		obj := o.DeepCopy()
		obj.SetOwnerReferences(owners)
		data, err := json.Marshal(obj)
		if err != nil {
			return err
		}
		if err := r.Client.Patch(ctx, obj, client.RawPatch(types.ApplyPatchType, data),
			client.FieldOwner(wellknown.RegistrationFieldManager), client.ForceOwnership); err != nil {
			return fmt.Errorf("applying %s %s: %w", obj.GetKind(), obj.GetName(), err)
		}
	}
	return nil
}
