package config

import (
	"bytes"
	"encoding/json"
	"slices"
)

// WritableHostPath is an entry of writableHostPaths: a data directory, and
// whose pods may write it. Written as a plain path, it is every pod's; with
// serviceAccounts or namespaces, it is scoped: only pods created in those
// namespaces, or running there as those service accounts, may mount it
// read-write, and for every other pod it is write-protected (admitted
// readOnly). Data that node software consumes as root (container logs the
// runtime opens, a storage engine's binaries) belongs to its owners' scope.
type WritableHostPath struct {
	Path string `json:"path"`
	// ServiceAccounts are the owners' pods, by namespace and service account.
	ServiceAccounts []ServiceAccountRef `json:"serviceAccounts,omitempty"`
	// Namespaces own the directory whole (broad: prefer service accounts).
	Namespaces []string `json:"namespaces,omitempty"`
}

// Scoped reports whether the entry names its owners.
func (w WritableHostPath) Scoped() bool { return len(w.ServiceAccounts) > 0 || len(w.Namespaces) > 0 }

// Admits reports whether a pod created in namespace as service account sa
// may write the directory.
func (w WritableHostPath) Admits(namespace, sa string) bool {
	return !w.Scoped() || slices.Contains(w.Namespaces, namespace) ||
		slices.Contains(w.ServiceAccounts, ServiceAccountRef{Namespace: namespace, Name: sa})
}

// UnmarshalJSON takes a plain path or an entry.
func (w *WritableHostPath) UnmarshalJSON(data []byte) error {
	if data = bytes.TrimSpace(data); len(data) > 0 && data[0] == '"' {
		*w = WritableHostPath{}
		return json.Unmarshal(data, &w.Path)
	}
	type entry WritableHostPath
	return json.Unmarshal(data, (*entry)(w))
}

// MarshalJSON writes an entry without scope as its plain path.
func (w WritableHostPath) MarshalJSON() ([]byte, error) {
	if !w.Scoped() {
		return json.Marshal(w.Path)
	}
	type entry WritableHostPath
	return json.Marshal(entry(w))
}

// WritablePaths lists the paths of writableHostPaths, scoped or not.
func (s *PolicySpec) WritablePaths() []string {
	out := make([]string, 0, len(s.WritableHostPaths))
	for _, w := range s.WritableHostPaths {
		out = append(out, w.Path)
	}
	return out
}

// Writable makes plain entries of paths, for every pod.
func Writable(paths ...string) []WritableHostPath {
	out := make([]WritableHostPath, 0, len(paths))
	for _, p := range paths {
		out = append(out, WritableHostPath{Path: p})
	}
	return out
}
