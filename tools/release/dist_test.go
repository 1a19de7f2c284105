package release

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDistArchives: each archive holds the binary (executable) and the
// LICENSE, the same bytes from the same tree, its checksum in SHA256SUMS
// and in the krew manifest, whose URIs name it. (krew's own validator and
// installer are not run here; docs/release.md says so.)
func TestDistArchives(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "LICENSE"), []byte("Apache-2.0"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(root, "gpuguard")
	if err := os.WriteFile(bin, []byte("program"), 0o755); err != nil {
		t.Fatal(err)
	}
	src := Source{RepoRoot: root, Version: "1.2.3", URL: "https://github.com/gpuguard/gpuguard", Epoch: time.Unix(1700000000, 0).UTC()}
	out := t.TempDir()
	var archives []Archive
	for _, p := range []Platform{{"linux", "amd64"}, {"windows", "amd64"}} {
		a, err := PackArchive(out, src, p, bin)
		if err != nil {
			t.Fatal(err)
		}
		again, err := PackArchive(t.TempDir(), src, p, bin)
		if err != nil || again.SHA256 != a.SHA256 {
			t.Errorf("%s: packed twice to %s and %s (%v): not reproducible", p, a.SHA256, again.SHA256, err)
		}
		data, err := os.ReadFile(filepath.Join(out, a.File))
		if err != nil {
			t.Fatal(err)
		}
		if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != a.SHA256 {
			t.Errorf("%s: recorded checksum is not the file's", a.File)
		}
		files := archiveContents(t, a.File, data)
		if files[binaryName(p)] != "program" || files["LICENSE"] != "Apache-2.0" || len(files) != 2 {
			t.Errorf("%s holds %v", a.File, files)
		}
		archives = append(archives, a)
	}
	if err := WriteChecksums(out, archives); err != nil {
		t.Fatal(err)
	}
	sums, _ := os.ReadFile(filepath.Join(out, "SHA256SUMS"))
	manifest, err := KrewManifest(src, archives, "https://example.com/v1.2.3")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range archives {
		if !strings.Contains(string(sums), a.SHA256+"  "+a.File+"\n") {
			t.Errorf("SHA256SUMS lacks %s:\n%s", a.File, sums)
		}
		if !strings.Contains(string(manifest), "sha256: "+a.SHA256) || !strings.Contains(string(manifest), "uri: https://example.com/v1.2.3/"+a.File) {
			t.Errorf("krew manifest lacks %s:\n%s", a.File, manifest)
		}
	}
	if !strings.Contains(string(manifest), "version: v1.2.3") || !strings.Contains(string(manifest), "bin: gpuguard.exe") {
		t.Errorf("krew manifest:\n%s", manifest)
	}
}

func archiveContents(t *testing.T, name string, data []byte) map[string]string {
	t.Helper()
	files := map[string]string{}
	if strings.HasSuffix(name, ".zip") {
		zr, err := zip.NewReader(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range zr.File {
			r, _ := f.Open()
			b, _ := io.ReadAll(r)
			files[f.Name] = string(b)
		}
		return files
	}
	gz, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == "gpuguard" && h.Mode&0o111 == 0 {
			t.Errorf("%s: the binary is not executable", name)
		}
		b, _ := io.ReadAll(tr)
		files[h.Name] = string(b)
	}
}
