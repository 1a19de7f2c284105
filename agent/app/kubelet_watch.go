package app

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/fsnotify/fsnotify"
	"github.com/go-logr/logr"

	"github.com/gpuguard/gpuguard/agent/plugin"
)

// watchKubeletSocket signals each time kubelet.sock is created in dir,
// which is what a restarting kubelet does.
func watchKubeletSocket(ctx context.Context, dir string, log logr.Logger) (<-chan struct{}, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watching %s: %w", dir, err)
	}
	if err := w.Add(dir); err != nil {
		w.Close()
		return nil, fmt.Errorf("watching the device plugin dir %s: %w", dir, err)
	}
	out := make(chan struct{}, 1)
	sock := filepath.Join(dir, plugin.KubeletSocketName)
	go func() {
		defer w.Close()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				if ev.Name == sock && ev.Has(fsnotify.Create) {
					select {
					case out <- struct{}{}:
					default: // a restart is already pending
					}
				}
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				log.Error(err, "watching the device plugin dir")
			}
		}
	}()
	return out, nil
}
