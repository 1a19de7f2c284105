// Package lookup reads what an admission review needs besides the object:
// namespace labels, from a metadata-only cache; the ConfigMaps envFrom
// names, on demand with a short-lived cache; and the node a pod is created
// bound to, on demand. Every read from the API server is bounded, well
// inside the webhook's own timeout.
package lookup

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilcache "k8s.io/apimachinery/pkg/util/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuguard/gpuguard/policy"
)

// ConfigMaps reads the ConfigMaps named by envFrom on demand, straight from the
// API server, and keeps each answer for a short while. It never watches ConfigMaps
// cluster-wide, and it has no way to read Secrets.
type ConfigMaps struct {
	reader  client.Reader
	cache   *utilcache.LRUExpireCache
	ttl     time.Duration
	timeout time.Duration // of one read, well inside the webhook's own timeout
	// lookups counts reads by result: hit, read, notfound, error.
	lookups *prometheus.CounterVec
}

// configMapCacheSize bounds memory: entries beyond it are evicted oldest first.
const configMapCacheSize = 1024

// NewConfigMaps reads through r, keeps answers for ttl, bounds each read to
// timeout (zero: unbounded) and counts reads in lookups, by result.
func NewConfigMaps(r client.Reader, ttl, timeout time.Duration, lookups *prometheus.CounterVec) *ConfigMaps {
	return &ConfigMaps{reader: r, cache: utilcache.NewLRUExpireCache(configMapCacheSize), ttl: ttl, timeout: timeout, lookups: lookups}
}

// cachedConfigMap is a cached answer; data is nil for a ConfigMap that was not found.
type cachedConfigMap struct {
	data map[string]string
}

// ConfigMapData is the data of a ConfigMap, or policy.ErrConfigMapNotFound.
func (c *ConfigMaps) ConfigMapData(ctx context.Context, namespace, name string) (map[string]string, error) {
	key := namespace + "/" + name
	if v, ok := c.cache.Get(key); ok {
		c.lookups.WithLabelValues("hit").Inc()
		return found(v.(cachedConfigMap))
	}
	cm := &corev1.ConfigMap{}
	ctx, cancel := WithReadTimeout(ctx, c.timeout)
	defer cancel()
	err := c.reader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, cm)
	switch {
	case apierrors.IsNotFound(err):
		c.lookups.WithLabelValues("notfound").Inc()
		c.cache.Add(key, cachedConfigMap{}, c.ttl)
		return nil, policy.ErrConfigMapNotFound
	case err != nil:
		c.lookups.WithLabelValues("error").Inc()
		return nil, err
	}
	c.lookups.WithLabelValues("read").Inc()
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

// WithReadTimeout bounds one API read; zero leaves ctx as it is.
func WithReadTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d)
}
