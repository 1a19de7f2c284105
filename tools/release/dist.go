package release

import (
	"archive/tar"
	"archive/zip"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	sigsyaml "sigs.k8s.io/yaml"
)

// CLIPlatforms are the platforms the gpuguard CLI is released for: it is
// static (CGO_ENABLED=0), so every one builds on any machine.
var CLIPlatforms = []Platform{{"linux", "amd64"}, {"linux", "arm64"}, {"darwin", "amd64"}, {"darwin", "arm64"}, {"windows", "amd64"}}

// ParseCLIPlatforms reads a comma-separated list of CLIPlatforms.
func ParseCLIPlatforms(s string) ([]Platform, error) {
	var out []Platform
	for _, item := range strings.Split(s, ",") {
		osName, arch, _ := strings.Cut(strings.TrimSpace(item), "/")
		p := Platform{osName, arch}
		if !slices.Contains(CLIPlatforms, p) {
			return nil, fmt.Errorf("platform %q: the CLI is released for %v", item, CLIPlatforms)
		}
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out, nil
}

// Archive is one CLI archive of a release.
type Archive struct {
	Platform Platform
	// File is the archive's name in the release directory.
	File   string
	SHA256 string
}

// binaryName is the CLI's file name on p.
func binaryName(p Platform) string {
	if p.OS == "windows" {
		return "gpuguard.exe"
	}
	return "gpuguard"
}

// archiveName is the name a release gives p's archive: .zip on Windows,
// where tar is not at hand, .tar.gz elsewhere.
func archiveName(version string, p Platform) string {
	ext := ".tar.gz"
	if p.OS == "windows" {
		ext = ".zip"
	}
	return fmt.Sprintf("gpuguard_%s_%s_%s%s", version, p.OS, p.Arch, ext)
}

// Dist builds the CLI for platforms and writes into out (replaced) one
// archive each (the binary and the LICENSE), SHA256SUMS, and the krew
// plugin manifest gpuguard.yaml whose archives are downloaded from
// downloadBase (the release's download URL; "" uses the project's GitHub
// release of this version).
func Dist(ctx context.Context, src Source, platforms []Platform, out, workDir, downloadBase string) ([]Archive, error) {
	if err := os.RemoveAll(out); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, err
	}
	cli := Specs()[0]
	var archives []Archive
	for _, p := range platforms {
		bin, err := buildBinary(ctx, src, cli, p, workDir)
		if err != nil {
			return nil, err
		}
		a, err := PackArchive(out, src, p, bin)
		if err != nil {
			return nil, err
		}
		archives = append(archives, a)
	}
	if err := WriteChecksums(out, archives); err != nil {
		return nil, err
	}
	if downloadBase == "" {
		downloadBase = fmt.Sprintf("%s/releases/download/v%s", strings.TrimSuffix(src.URL, "/"), src.Version)
	}
	manifest, err := KrewManifest(src, archives, downloadBase)
	if err != nil {
		return nil, err
	}
	return archives, os.WriteFile(filepath.Join(out, "gpuguard.yaml"), manifest, 0o644)
}

// PackArchive writes p's archive of the binary at bin into out: the binary
// and the repository's LICENSE, owned by root, dated at the source's epoch,
// so that the same tree gives the same bytes.
func PackArchive(out string, src Source, p Platform, bin string) (Archive, error) {
	license, err := os.ReadFile(filepath.Join(src.RepoRoot, "LICENSE"))
	if err != nil {
		return Archive{}, fmt.Errorf("the archives carry the LICENSE: %w", err)
	}
	program, err := os.ReadFile(bin)
	if err != nil {
		return Archive{}, err
	}
	files := []archiveFile{{name: binaryName(p), mode: 0o755, data: program}, {name: "LICENSE", mode: 0o644, data: license}}
	a := Archive{Platform: p, File: archiveName(src.Version, p)}
	path := filepath.Join(out, a.File)
	f, err := os.Create(path)
	if err != nil {
		return Archive{}, err
	}
	sum := sha256.New()
	w := io.MultiWriter(f, sum)
	if p.OS == "windows" {
		err = writeZip(w, files, src.Epoch)
	} else {
		err = writeTarGz(w, files, src.Epoch)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Archive{}, fmt.Errorf("writing %s: %w", path, err)
	}
	a.SHA256 = hex.EncodeToString(sum.Sum(nil))
	return a, nil
}

type archiveFile struct {
	name string
	mode int64
	data []byte
}

func writeTarGz(w io.Writer, files []archiveFile, at time.Time) error {
	gz, err := gzip.NewWriterLevel(w, gzip.BestCompression)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(gz)
	for _, f := range files {
		hdr := &tar.Header{Name: f.name, Mode: f.mode, Size: int64(len(f.data)), ModTime: at, Typeflag: tar.TypeReg, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := tw.Write(f.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return gz.Close()
}

func writeZip(w io.Writer, files []archiveFile, at time.Time) error {
	zw := zip.NewWriter(w)
	for _, f := range files {
		hdr := &zip.FileHeader{Name: f.name, Method: zip.Deflate, Modified: at}
		hdr.SetMode(os.FileMode(f.mode))
		fw, err := zw.CreateHeader(hdr)
		if err != nil {
			return err
		}
		if _, err := fw.Write(f.data); err != nil {
			return err
		}
	}
	return zw.Close()
}

// WriteChecksums writes SHA256SUMS, as sha256sum prints it, so that
// `sha256sum -c SHA256SUMS` checks the downloads.
func WriteChecksums(out string, archives []Archive) error {
	lines := make([]string, 0, len(archives))
	for _, a := range archives {
		lines = append(lines, a.SHA256+"  "+a.File)
	}
	sort.Strings(lines)
	return os.WriteFile(filepath.Join(out, "SHA256SUMS"), []byte(strings.Join(lines, "\n")+"\n"), 0o644)
}

// krewPlugin is a krew plugin manifest (krew.googlecontainertools.github.com/
// v1alpha2 Plugin), with the fields gpuguard's uses.
type krewPlugin struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec krewSpec `json:"spec"`
}

type krewSpec struct {
	Version          string         `json:"version"`
	Homepage         string         `json:"homepage"`
	ShortDescription string         `json:"shortDescription"`
	Description      string         `json:"description"`
	Caveats          string         `json:"caveats,omitempty"`
	Platforms        []krewPlatform `json:"platforms"`
}

type krewPlatform struct {
	Selector struct {
		MatchLabels map[string]string `json:"matchLabels"`
	} `json:"selector"`
	URI    string     `json:"uri"`
	SHA256 string     `json:"sha256"`
	Files  []krewFile `json:"files"`
	Bin    string     `json:"bin"`
}

type krewFile struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// KrewManifest is the krew plugin manifest of the archives: `kubectl krew
// install --manifest gpuguard.yaml` installs `kubectl gpuguard`.
func KrewManifest(src Source, archives []Archive, downloadBase string) ([]byte, error) {
	var p krewPlugin
	p.APIVersion, p.Kind, p.Metadata.Name = "krew.googlecontainertools.github.com/v1alpha2", "Plugin", "gpuguard"
	p.Spec = krewSpec{
		Version:          "v" + src.Version,
		Homepage:         src.URL,
		ShortDescription: "Find pods that can reach GPUs not given them",
		Description: "gpuguard checks manifests (check) and running clusters (audit) for pods that can reach\n" +
			"NVIDIA GPUs the scheduler did not give them: NVIDIA_VISIBLE_DEVICES in images, env and\n" +
			"Secrets, CDI and NRI annotations, device-list mounts, host paths and privilege.\n",
		Caveats: "kubectl gpuguard audit needs list on pods and pod controllers, and get on the policy ConfigMap.\n",
	}
	for _, a := range archives {
		pl := krewPlatform{URI: strings.TrimSuffix(downloadBase, "/") + "/" + a.File, SHA256: a.SHA256, Bin: binaryName(a.Platform),
			Files: []krewFile{{From: binaryName(a.Platform), To: "."}, {From: "LICENSE", To: "."}}}
		pl.Selector.MatchLabels = map[string]string{"os": a.Platform.OS, "arch": a.Platform.Arch}
		p.Spec.Platforms = append(p.Spec.Platforms, pl)
	}
	return sigsyaml.Marshal(p)
}
