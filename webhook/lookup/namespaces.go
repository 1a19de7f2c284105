package lookup

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Informers is what Namespaces needs of a controller-runtime cache.
type Informers interface {
	client.Reader
	GetInformer(ctx context.Context, obj client.Object, opts ...cache.InformerGetOption) (cache.Informer, error)
	WaitForCacheSync(ctx context.Context) bool
}

// Namespaces serves namespace labels from a metadata-only informer, and from
// the API server for a namespace the informer has not seen yet (one created a
// moment before its first pod).
type Namespaces struct {
	cache   Informers
	reader  client.Reader
	timeout time.Duration // of one read from the API server
	synced  chan struct{}
}

// NewNamespaces reads labels from c, started by Start, and from r, each read
// bounded to timeout (zero: unbounded), for a namespace c does not have.
func NewNamespaces(c Informers, r client.Reader, timeout time.Duration) *Namespaces {
	return &Namespaces{cache: c, reader: r, timeout: timeout, synced: make(chan struct{})}
}

func namespaceMeta() *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Namespace"))
	return m
}

// Start warms the informer, so that the first admission does not wait for it.
func (n *Namespaces) Start(ctx context.Context) error {
	if _, err := n.cache.GetInformer(ctx, namespaceMeta()); err != nil {
		return fmt.Errorf("watching namespaces: %w", err)
	}
	if n.cache.WaitForCacheSync(ctx) {
		close(n.synced)
	}
	return nil
}

// NamespaceLabels are the labels of namespace name.
func (n *Namespaces) NamespaceLabels(ctx context.Context, name string) (map[string]string, error) {
	m := namespaceMeta()
	err := n.cache.Get(ctx, client.ObjectKey{Name: name}, m)
	if apierrors.IsNotFound(err) {
		ctx, cancel := WithReadTimeout(ctx, n.timeout)
		defer cancel()
		err = n.reader.Get(ctx, client.ObjectKey{Name: name}, m)
	}
	if err != nil {
		return nil, err
	}
	return m.Labels, nil
}

// Ready fails until the namespace cache has synced.
func (n *Namespaces) Ready(*http.Request) error {
	select {
	case <-n.synced:
		return nil
	default:
		return errors.New("namespace cache not synced yet")
	}
}
