package servingcert

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
)

// DirWriter keeps the webhook's certificate directory in step with the
// Secret that cert-controller maintains. A mounted Secret volume gets there
// too, but only when the kubelet next syncs it, a minute or more after the
// Secret is written; cert-controller waits for the files, so a fresh install
// would wait that long before its first replica is ready. Writing the files
// from the Secret directly makes a replica ready within seconds. Every
// replica writes its own directory, so it runs without leader election.
type DirWriter struct {
	client kubernetes.Interface
	secret types.NamespacedName
	dir    string
	// files maps a Secret key to the file it is written to.
	files map[string]string
	log   logr.Logger
	// written is closed, once, when the files first hold the Secret's.
	written chan struct{}
	once    sync.Once
}

// NewDirWriter writes o.Secret's certificate and key into o.Dir.
func NewDirWriter(client kubernetes.Interface, o Options, log logr.Logger) *DirWriter {
	return &DirWriter{client: client, secret: o.Secret, dir: o.Dir,
		files: map[string]string{"tls.crt": o.CertName, "tls.key": o.KeyName}, log: log, written: make(chan struct{})}
}

// Written is closed once the directory holds the Secret's certificate and
// key.
func (w *DirWriter) Written() <-chan struct{} { return w.written }

// NeedLeaderElection is false: every replica needs its own files.
func (w *DirWriter) NeedLeaderElection() bool { return false }

// resync replays the Secret now and then, so that a write that failed (a
// full or unwritable directory) is tried again without a Secret change.
const certDirResync = 30 * time.Second

// Start watches the one Secret (its namespace's Secrets, narrowed by name, as
// cert-controller's RBAC allows) and writes it on every change, and on every
// resync, until ctx ends.
func (w *DirWriter) Start(ctx context.Context) error {
	if err := os.MkdirAll(w.dir, 0o700); err != nil {
		return fmt.Errorf("certificate directory (certificates.writeDir): %w", err)
	}
	factory := informers.NewSharedInformerFactoryWithOptions(w.client, certDirResync,
		informers.WithNamespace(w.secret.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", w.secret.Name).String()
		}))
	_, err := factory.Core().V1().Secrets().Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    w.onSecret,
		UpdateFunc: func(_, obj any) { w.onSecret(obj) },
	})
	if err != nil {
		return err
	}
	factory.Start(ctx.Done())
	<-ctx.Done()
	factory.Shutdown()
	return nil
}

func (w *DirWriter) onSecret(obj any) {
	secret, ok := obj.(*corev1.Secret)
	if !ok {
		return
	}
	written, err := w.write(secret)
	if err != nil {
		w.log.Error(err, "serving certificate not written; the webhook keeps the one it has", "secret", w.secret.String())
		return
	}
	if written {
		w.log.Info("serving certificate written from the Secret", "secret", w.secret.String(), "dir", w.dir)
	}
	if complete(secret, w.files) {
		w.once.Do(func() { close(w.written) })
	}
}

// complete says whether the Secret holds every file.
func complete(secret *corev1.Secret, files map[string]string) bool {
	for key := range files {
		if len(secret.Data[key]) == 0 {
			return false
		}
	}
	return true
}

// write writes the Secret's certificate and key when both are there and
// differ from the files, the key first: the certificate watcher reloads on
// either file, and a certificate whose key is not there yet would not load.
// It reports whether it wrote anything.
func (w *DirWriter) write(secret *corev1.Secret) (bool, error) {
	for key := range w.files {
		if len(secret.Data[key]) == 0 {
			return false, nil // cert-controller has not filled the Secret yet
		}
	}
	written := false
	for _, key := range []string{"tls.key", "tls.crt"} {
		path := filepath.Join(w.dir, w.files[key])
		if current, err := os.ReadFile(path); err == nil && bytes.Equal(current, secret.Data[key]) {
			continue
		}
		if err := writeFileAtomic(path, secret.Data[key]); err != nil {
			return written, err
		}
		written = true
	}
	return written, nil
}

// writeFileAtomic replaces path with data by renaming a complete temporary
// file over it, so the certificate watcher never reads half a file.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // after a successful rename, there is nothing to remove
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
