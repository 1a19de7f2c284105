package release

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	spdxjson "github.com/spdx/tools-golang/json"
	spdx "github.com/spdx/tools-golang/spdx/v2/v2_3"
	"github.com/spdx/tools-golang/spdxlib"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/registry"
	sigsyaml "sigs.k8s.io/yaml"
)

// built is one host-platform build of both images, shared by the tests.
var built struct {
	dir    string
	images []Built
	err    error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

func buildOnce(t *testing.T) (string, []Built) {
	t.Helper()
	if built.dir == "" && built.err == nil {
		built.dir, built.err = os.MkdirTemp("", "release-test-")
		if built.err == nil {
			built.images, built.err = buildInto(t, filepath.Join(built.dir, "layout"))
		}
	}
	if built.err != nil {
		t.Fatal(built.err)
	}
	return filepath.Join(built.dir, "layout"), built.images
}

func buildInto(t *testing.T, dir string) ([]Built, error) {
	src, err := ReadSource(repoRoot(t))
	if err != nil {
		return nil, err
	}
	return Build(t.Context(), src, Specs(), []Platform{HostPlatform()}, dir, t.TempDir())
}

func repoRoot(t *testing.T) string {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// TestBuildIsReproducible builds both images twice from the same tree:
// the index, every platform image and every SBOM have the same digest.
func TestBuildIsReproducible(t *testing.T) {
	dir, first := buildOnce(t)
	again := filepath.Join(t.TempDir(), "again")
	second, err := buildInto(t, again)
	if err != nil {
		t.Fatal(err)
	}
	for i := range first {
		if first[i].Digest != second[i].Digest {
			t.Errorf("%s: first build %s, second %s", first[i].Name, first[i].Digest, second[i].Digest)
		}
	}
	a, errA := os.ReadFile(filepath.Join(dir, "index.json"))
	b, errB := os.ReadFile(filepath.Join(again, "index.json"))
	if err := errors.Join(errA, errB); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Errorf("the layouts' index.json differ (SBOM digests):\n%s\n%s", a, b)
	}
}

// TestImagesRunAsDocumented checks what the chart relies on: the
// entrypoint, the user (non-root for gpuguard), OCI media types, and for
// the cgo agent a dynamic loader and C library of its own architecture.
func TestImagesRunAsDocumented(t *testing.T) {
	dir, images := buildOnce(t)
	for _, b := range images {
		spec := specNamed(t, b.Name)
		img := platformImageOf(t, dir, b, HostPlatform())
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(cf.Config.Entrypoint, []string{spec.Binary}) || cf.Config.User != spec.User {
			t.Errorf("%s: entrypoint %v as %q, want %s as %s", b.Name, cf.Config.Entrypoint, cf.Config.User, spec.Binary, spec.User)
		}
		if mt, _ := img.MediaType(); mt != types.OCIManifestSchema1 {
			t.Errorf("%s: manifest media type %s", b.Name, mt)
		}
		files := imageFiles(t, img)
		if _, ok := files[strings.TrimPrefix(spec.Binary, "/")]; !ok {
			t.Errorf("%s: no %s in the image", b.Name, spec.Binary)
		}
		if b.Name == "gpuguard" && !strings.Contains(string(files["etc/passwd"].data), "nonroot:x:65532:65532") {
			t.Errorf("gpuguard: /etc/passwd names no nonroot user 65532:\n%s", files["etc/passwd"].data)
		}
		if spec.CGO {
			checkCLibrary(t, b.Name, files)
		}
	}
}

// checkCLibrary wants the loader the program names, resolvable in the image,
// and libc for the machine's architecture, with the dpkg record of its package.
func checkCLibrary(t *testing.T, image string, files map[string]imageFile) {
	triple := crossTriple(HostPlatform().Arch)
	libc, ok := files["lib/"+triple+"/libc.so.6"]
	if !ok {
		t.Fatalf("%s: no lib/%s/libc.so.6", image, triple)
	}
	f, err := elf.NewFile(bytes.NewReader(libc.data))
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[HostPlatform().Arch]; f.Machine != want {
		t.Errorf("%s: libc is for %s, want %s", image, f.Machine, want)
	}
	var loader, status bool
	for p, file := range files {
		if strings.Contains(p, "ld-linux") && file.link != "" {
			_, loader = files[strings.TrimPrefix(file.link, "/")]
		}
		status = status || strings.HasPrefix(p, "var/lib/dpkg/status.d/libc6")
	}
	if !loader || !status {
		t.Errorf("%s: dynamic loader link resolves: %t; dpkg status of libc6: %t", image, loader, status)
	}
}

// TestSBOMsDescribeWhatWasBuilt reads each platform image's SBOM referrer:
// valid SPDX 2.3, naming the Go toolchain, the modules linked in, and for
// the agent the Debian C library.
func TestSBOMsDescribeWhatWasBuilt(t *testing.T) {
	dir, images := buildOnce(t)
	for _, b := range images {
		doc := sbomOf(t, dir, b.Platforms[HostPlatform().String()])
		if err := spdxlib.ValidateDocument(doc); err != nil {
			t.Errorf("%s: invalid SPDX: %v", b.Name, err)
		}
		var names []string
		for _, p := range doc.Packages {
			names = append(names, p.PackageName)
		}
		want := []string{b.Name, "go", "github.com/gpuguard/gpuguard", "k8s.io/apimachinery"}
		if specNamed(t, b.Name).CGO {
			want = append(want, "libc6")
		}
		for _, w := range want {
			if !slices.Contains(names, w) {
				t.Errorf("%s: SBOM has no package %s (has %v)", b.Name, w, names)
			}
		}
	}
}

// TestPushPinsTheChartToTheImages pushes the layout and the chart to a
// registry: both indexes are there by tag, each image's SBOM is its
// referrer, and the chart that comes back selects both images by digest.
func TestPushPinsTheChartToTheImages(t *testing.T) {
	dir, images := buildOnce(t)
	srv := httptest.NewServer(ggcrregistry.New(ggcrregistry.WithReferrersSupport(true), ggcrregistry.Logger(discard())))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://") + "/team"
	pushed, err := Push(t.Context(), dir, host, []name.Option{name.Insecure})
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range pushed {
		if p.Digest != images[i].Digest || p.Repository != host+"/"+images[i].Name {
			t.Errorf("pushed %+v, built %+v", p, images[i])
		}
		platform := images[i].Platforms[HostPlatform().String()]
		ref, err := name.NewDigest(p.Repository+"@"+platform.String(), name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		refs, err := remote.Referrers(ref)
		if err != nil {
			t.Fatal(err)
		}
		if im, _ := refs.IndexManifest(); len(im.Manifests) != 1 {
			t.Errorf("%s: %d referrers of the %s image, want its SBOM", p.Name, len(im.Manifests), HostPlatform())
		}
	}
	client, err := registry.NewClient(registry.ClientOptPlainHTTP(), registry.ClientOptWriter(io.Discard))
	if err != nil {
		t.Fatal(err)
	}
	chart, err := PushChart(filepath.Join(repoRoot(t), "charts", "gpuguard"), host, pushed, client)
	if err != nil {
		t.Fatal(err)
	}
	pulled, err := client.Pull(strings.TrimPrefix(chart.Ref, "oci://") + ":" + chart.Version)
	if err != nil {
		t.Fatal(err)
	}
	c, err := loader.LoadArchive(bytes.NewReader(pulled.Chart.Data))
	if err != nil {
		t.Fatal(err)
	}
	var values struct {
		Webhook, Agent struct {
			Image struct{ Repository, Digest string }
		}
	}
	for _, f := range c.Raw {
		if f.Name == "values.yaml" {
			err = sigsyaml.Unmarshal(f.Data, &values)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	got := []string{values.Webhook.Image.Repository + "@" + values.Webhook.Image.Digest, values.Agent.Image.Repository + "@" + values.Agent.Image.Digest}
	if want := []string{pushed[0].Ref(), pushed[1].Ref()}; !slices.Equal(got, want) {
		t.Errorf("the pushed chart selects %v, want %v", got, want)
	}
}

func TestPushRefusesWhatIsNotALayout(t *testing.T) {
	_, err := Push(t.Context(), t.TempDir(), "localhost:1", nil)
	if err == nil || !strings.Contains(err.Error(), "make images writes one") {
		t.Fatalf("want an error saying what the layout should be, got %v", err)
	}
}

func TestParsePlatforms(t *testing.T) {
	got, err := ParsePlatforms("linux/amd64, linux/arm64,linux/amd64")
	if err != nil || !slices.Equal(got, DefaultPlatforms) {
		t.Errorf("got %v, %v", got, err)
	}
	for _, bad := range []string{"", "linux", "windows/amd64", "linux/riscv64"} {
		if _, err := ParsePlatforms(bad); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
}

func specNamed(t *testing.T, name string) Spec {
	for _, s := range Specs() {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no spec %s", name)
	return Spec{}
}

func platformImageOf(t *testing.T, dir string, b Built, p Platform) v1.Image {
	lp, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	images, err := idx.ImageIndex(b.Digest)
	if err != nil {
		t.Fatal(err)
	}
	img, err := images.Image(b.Platforms[p.String()])
	if err != nil {
		t.Fatal(err)
	}
	return img
}

type imageFile struct {
	data []byte
	link string
}

// imageFiles reads every layer of img, by path without the leading slash.
func imageFiles(t *testing.T, img v1.Image) map[string]imageFile {
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]imageFile{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			hdr, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			data, _ := io.ReadAll(tr)
			files[strings.TrimSuffix(hdr.Name, "/")] = imageFile{data: data, link: hdr.Linkname}
		}
		rc.Close()
	}
	return files
}

// sbomOf finds, in the layout at dir, the SBOM artifact whose subject is
// the image with digest subject, and decodes it.
func sbomOf(t *testing.T, dir string, subject v1.Hash) *spdx.Document {
	lp, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	root, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := root.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	for _, desc := range im.Manifests {
		if desc.ArtifactType != SBOMMediaType {
			continue
		}
		artifact, err := root.Image(desc.Digest)
		if err != nil {
			t.Fatal(err)
		}
		m, err := artifact.Manifest()
		if err != nil {
			t.Fatal(err)
		}
		if m.Subject == nil || m.Subject.Digest != subject {
			continue
		}
		if m.ArtifactType != SBOMMediaType || m.Config.MediaType != emptyMediaType || len(m.Layers) != 1 {
			t.Fatalf("SBOM artifact %s is not shaped as OCI 1.1 asks: %+v", desc.Digest, m)
		}
		rc, err := artifact.LayerByDigest(m.Layers[0].Digest)
		if err != nil {
			t.Fatal(err)
		}
		r, err := rc.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		doc, err := spdxjson.Read(r)
		if err != nil {
			t.Fatal(err)
		}
		return doc
	}
	t.Fatalf("no SBOM has subject %s", subject)
	return nil
}

func discard() *log.Logger { return log.New(io.Discard, "", 0) }
