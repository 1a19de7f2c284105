package webhook

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilcache "k8s.io/apimachinery/pkg/util/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpuguard/gpuguard/policy"
)

// configMapReader reads the ConfigMaps named by envFrom on demand, straight from the
// API server, and keeps each answer for a short while. It never watches ConfigMaps
// cluster-wide, and it has no way to read Secrets.
type configMapReader struct {
	reader  client.Reader
	cache   *utilcache.LRUExpireCache
	ttl     time.Duration
	timeout time.Duration // of one read, well inside the webhook's own timeout
	metrics *Metrics
}

// configMapCacheSize bounds memory: entries beyond it are evicted oldest first.
const configMapCacheSize = 1024

func newConfigMapReader(r client.Reader, ttl, timeout time.Duration, m *Metrics) *configMapReader {
	return &configMapReader{reader: r, cache: utilcache.NewLRUExpireCache(configMapCacheSize), ttl: ttl, timeout: timeout, metrics: m}
}

// cachedConfigMap is a cached answer; data is nil for a ConfigMap that was not found.
type cachedConfigMap struct {
	data map[string]string
}

func (c *configMapReader) ConfigMapData(ctx context.Context, namespace, name string) (map[string]string, error) {
	key := namespace + "/" + name
	if v, ok := c.cache.Get(key); ok {
		c.metrics.ConfigMapLookups.WithLabelValues("hit").Inc()
		return found(v.(cachedConfigMap))
	}
	cm := &corev1.ConfigMap{}
	ctx, cancel := withReadTimeout(ctx, c.timeout)
	defer cancel()
	err := c.reader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, cm)
	switch {
	case apierrors.IsNotFound(err):
		c.metrics.ConfigMapLookups.WithLabelValues("notfound").Inc()
		c.cache.Add(key, cachedConfigMap{}, c.ttl)
		return nil, policy.ErrConfigMapNotFound
	case err != nil:
		c.metrics.ConfigMapLookups.WithLabelValues("error").Inc()
		return nil, err
	}
	c.metrics.ConfigMapLookups.WithLabelValues("read").Inc()
	data := cm.Data
	if data == nil {
		data = map[string]string{}
	}
	c.cache.Add(key, cachedConfigMap{data: data}, c.ttl)
	return data, nil
}

func found(c cachedConfigMap) (map[string]string, error) {
	if c.data == nil {
		return nil, policy.ErrConfigMapNotFound
	}
	return c.data, nil
}

// withReadTimeout bounds one API read; zero leaves ctx as it is.
func withReadTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d)
}
