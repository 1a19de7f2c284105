package registration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const mutating = `apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: gpuguard
webhooks:
  - name: mutate.pods.gpuguard.io
    clientConfig: {service: {name: gpuguard-webhook, namespace: gpuguard, path: /mutate}}
    admissionReviewVersions: ["v1"]
    sideEffects: None
`

const validating = `apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: gpuguard
webhooks:
  - name: validate.pods.gpuguard.io
    clientConfig: {service: {name: gpuguard-webhook, namespace: gpuguard, path: /validate}}
    admissionReviewVersions: ["v1"]
    sideEffects: None
`

func write(t *testing.T, content string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "configurations.yaml")
	if err := os.WriteFile(f, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestLoad(t *testing.T) {
	objs, err := Load(write(t, "# comment\n"+mutating+"---\n"+validating), "gpuguard", "gpuguard")
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 2 || objs[0].GetKind() != "MutatingWebhookConfiguration" || objs[1].GetKind() != "ValidatingWebhookConfiguration" {
		t.Fatalf("loaded %v", objs)
	}
}

// TestLoadRefuses: the webhook registers only its own two configurations,
// well formed; anything else is refused at start, naming what is wrong.
func TestLoadRefuses(t *testing.T) {
	for name, tc := range map[string]struct{ content, want string }{
		"another name":      {strings.Replace(validating, "name: gpuguard\n", "name: other\n", 1), `"other": the webhook registers only "gpuguard"`},
		"another kind":      {"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: gpuguard}\n", "document 1 is v1 ConfigMap"},
		"twice":             {mutating + "---\n" + mutating, "a second MutatingWebhookConfiguration"},
		"misspelt field":    {strings.Replace(mutating, "sideEffects", "sideEfects", 1), "sideEfects"},
		"nothing":           {"# empty\n", "holds no webhook configuration"},
		"not YAML":          {"webhooks: [\n", "document 1"},
		"webhooks not list": {strings.Replace(validating, "webhooks:\n", "webhooks: 3\nx:\n", 1), "ValidatingWebhookConfiguration gpuguard"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Load(write(t, tc.content), "gpuguard", "gpuguard")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
	if _, err := Load(filepath.Join(t.TempDir(), "absent.yaml"), "gpuguard", "gpuguard"); err == nil || !strings.Contains(err.Error(), "reading the webhook configurations") {
		t.Errorf("a missing file: %v", err)
	}
}

// TestNotRegisteredNotReady: a registrar that has applied nothing fails its
// readiness check, so a controller is not ready (and helm install --wait
// does not return) before the webhook is called.
func TestNotRegisteredNotReady(t *testing.T) {
	r := NewRegistrar(Registrar{File: write(t, mutating+"---\n"+validating), MutatingConfig: "gpuguard", ValidatingConfig: "gpuguard"})
	if err := r.Registered(nil); err == nil {
		t.Error("ready before the configurations were applied")
	}
}
