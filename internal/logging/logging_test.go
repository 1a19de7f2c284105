package logging

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/klog/v2"
)

// TestOneShapeForEveryLine: a line logged directly and one that client-go
// writes through klog are both JSON objects with an ISO 8601 timestamp, and
// bad flag values are refused with the flag's name.
func TestOneShapeForEveryLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	log, err := Options{Format: "json", Level: "info"}.Build(path)
	if err != nil {
		t.Fatal(err)
	}
	Install(log)
	defer klog.ClearLogger()
	log.Info("direct", "k", "v")
	klog.InfoS("through klog", "k", "v")
	klog.Flush()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 lines, got %d:\n%s", len(lines), data)
	}
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("not a JSON line: %q", l)
		}
		ts, ok := m["ts"].(string)
		if !ok || !strings.Contains(ts, "T") {
			t.Errorf("ts %v is not ISO 8601: %q", m["ts"], l)
		}
	}
	for _, o := range []Options{{Format: "xml", Level: "info"}, {Format: "json", Level: "loud"}, {Format: "json", Level: "warn"}} {
		if _, err := o.Build(path); err == nil || !strings.Contains(err.Error(), "--log-") {
			t.Errorf("%+v: %v", o, err)
		}
	}
}
