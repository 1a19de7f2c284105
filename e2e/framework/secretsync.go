package framework

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuguard/gpuguard/internal/testcerts"
)

// SyncSecretToDir does what the kubelet does for a Secret volume: it writes the
// Secret's tls.crt and tls.key into dir, and again whenever they change, until the
// returned stop function is called. Without a node, a webhook process running
// beside the API server needs someone to do this for its self-managed certificates.
func SyncSecretToDir(ctx context.Context, c kubernetes.Interface, namespace, name, dir string) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			if secret, err := c.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{}); err == nil {
				for _, key := range []string{"tls.crt", "tls.key"} {
					syncFile(filepath.Join(dir, key), secret.Data[key])
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return func() { cancel(); <-done }
}

func syncFile(path string, data []byte) {
	if len(data) == 0 {
		return
	}
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return
	}
	_ = testcerts.WriteAtomic(path, data)
}
