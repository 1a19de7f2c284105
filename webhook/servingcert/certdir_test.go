package servingcert

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestCertDirWriterWritesFilledSecrets(t *testing.T) {
	dir := t.TempDir()
	w := NewDirWriter(nil, Options{Dir: dir, CertName: "tls.crt", KeyName: "tls.key",
		Secret: types.NamespacedName{Namespace: "gpuguard", Name: "tls"}}, logr.Discard())
	secret := func(crt, key string) *corev1.Secret {
		return &corev1.Secret{Data: map[string][]byte{"tls.crt": []byte(crt), "tls.key": []byte(key), "ca.crt": []byte("ca")}}
	}
	steps := []struct {
		name        string
		secret      *corev1.Secret
		wantWritten bool
		wantCrt     string // "" when the file must not exist
	}{
		// The chart creates the Secret empty; cert-controller fills it.
		{"empty Secret", &corev1.Secret{}, false, ""},
		{"key only", secret("", "key1"), false, ""},
		{"filled", secret("crt1", "key1"), true, "crt1"},
		{"unchanged", secret("crt1", "key1"), false, "crt1"},
		{"rotated", secret("crt2", "key2"), true, "crt2"},
	}
	for _, st := range steps {
		written, err := w.write(st.secret)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if written != st.wantWritten {
			t.Errorf("%s: written = %v, want %v", st.name, written, st.wantWritten)
		}
		crt, err := os.ReadFile(filepath.Join(dir, "tls.crt"))
		if st.wantCrt == "" {
			if !os.IsNotExist(err) {
				t.Errorf("%s: tls.crt exists (%q, %v), want none", st.name, crt, err)
			}
			continue
		}
		if string(crt) != st.wantCrt {
			t.Errorf("%s: tls.crt = %q, want %q", st.name, crt, st.wantCrt)
		}
	}
	key, _ := os.ReadFile(filepath.Join(dir, "tls.key"))
	if string(key) != "key2" {
		t.Errorf("tls.key = %q, want the rotated key", key)
	}
	if leftovers, _ := filepath.Glob(filepath.Join(dir, ".*")); len(leftovers) != 0 {
		t.Errorf("temporary files left behind: %v", leftovers)
	}
}

func TestCertDirWriterReportsUnwritableDir(t *testing.T) {
	w := NewDirWriter(nil, Options{Dir: filepath.Join(t.TempDir(), "missing"), CertName: "tls.crt", KeyName: "tls.key"}, logr.Discard())
	if _, err := w.write(&corev1.Secret{Data: map[string][]byte{"tls.crt": []byte("c"), "tls.key": []byte("k")}}); err == nil {
		t.Fatal("want an error for a directory that does not exist")
	}
}

// TestWrittenOnceTheSecretIsFilled: a serving pod that follows the
// controller's Secret starts serving only once the files hold a
// certificate and key, not on the empty Secret the chart creates.
func TestWrittenOnceTheSecretIsFilled(t *testing.T) {
	w := NewDirWriter(nil, Options{Dir: t.TempDir(), CertName: "tls.crt", KeyName: "tls.key",
		Secret: types.NamespacedName{Namespace: "gpuguard", Name: "tls"}}, logr.Discard())
	isWritten := func() bool {
		select {
		case <-w.Written():
			return true
		default:
			return false
		}
	}
	w.onSecret(&corev1.Secret{})
	w.onSecret(&corev1.Secret{Data: map[string][]byte{"tls.key": []byte("k")}})
	if isWritten() {
		t.Fatal("written before the Secret held both files")
	}
	filled := &corev1.Secret{Data: map[string][]byte{"tls.crt": []byte("c"), "tls.key": []byte("k")}}
	w.onSecret(filled)
	w.onSecret(filled) // unchanged: no second close
	if !isWritten() {
		t.Fatal("not written once the Secret held both files")
	}
}
