package kubenode

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Test images the node runs. They are built locally and imported into
// containerd; pods use imagePullPolicy: Never, so nothing is pulled.
// gpuguard's own images are pulled from a registry (LocalCluster).
const (
	// PauseImage is the sandbox image named in the containerd config.
	PauseImage = "registry.k8s.io/pause:3.10.1"
	// ProbeImage reports what its container was given (images/probe).
	ProbeImage = "gpuguard.test/probe:e2e"
	// RootGroupProbeImage is the probe in an image whose /etc/passwd gives
	// user 65534 root's group as its primary group and whose /etc/group
	// adds it to root's group again: what any tenant can build.
	RootGroupProbeImage = "gpuguard.test/probe-root-group:e2e"
)

// testImage is a single-binary image built from a Go program of this module.
type testImage struct {
	ref    string
	pkg    string // Go package of the program, relative to the repository
	binary string // path of the program in the image
	env    []string
	// user runs the entrypoint ("uid:gid"); root when empty. A non-root
	// image also gets an /etc/passwd naming it, as distroless images have.
	user string
	// files are added to the image, by path without the leading slash.
	files map[string][]byte
}

func testImages() []testImage {
	return []testImage{
		{ref: PauseImage, pkg: "./e2e/framework/kubenode/images/pause", binary: "/pause"},
		// The probe carries the variables of a CUDA base image: without
		// anything else, the NVIDIA runtime gives such a container every GPU.
		{ref: ProbeImage, pkg: "./e2e/framework/kubenode/images/probe", binary: "/probe",
			env: []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"}},
		{ref: RootGroupProbeImage, pkg: "./e2e/framework/kubenode/images/probe", binary: "/probe", files: map[string][]byte{
			"etc/passwd": []byte("root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:0:nobody:/nonexistent:/sbin/nologin\n"),
			"etc/group":  []byte("root:x:0:nobody\nnogroup:x:65534:\n"),
		}},
	}
}

// BuildImages builds the test images into one docker-archive tarball in dir,
// ready for `ctr images import`.
func BuildImages(repoRoot, dir string) (string, error) {
	refs := map[name.Reference]v1.Image{}
	for _, ti := range testImages() {
		img, err := ti.build(repoRoot, dir)
		if err != nil {
			return "", fmt.Errorf("image %s: %w", ti.ref, err)
		}
		ref, err := name.ParseReference(ti.ref)
		if err != nil {
			return "", err
		}
		refs[ref] = img
	}
	path := filepath.Join(dir, "images.tar")
	return path, tarball.MultiRefWriteToFile(path, refs)
}

func (ti testImage) build(repoRoot, dir string) (v1.Image, error) {
	bin := filepath.Join(dir, filepath.Base(ti.binary))
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, ti.pkg)
	cmd.Dir = repoRoot
	// Static, so the image needs no libc.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build %s: %w\n%s", ti.pkg, err, out)
	}
	layer, err := binaryLayer(bin, ti.binary, ti.user, ti.files)
	if err != nil {
		return nil, err
	}
	return imageOf(layer, ti)
}

// imageOf is a one-layer image running ti's binary as ti's user.
func imageOf(layer v1.Layer, ti testImage) (v1.Image, error) {
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	// Without OS and architecture `ctr images import` drops the image as
	// not matching the platform.
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config.Entrypoint = []string{ti.binary}
	cf.Config.Env = append([]string{"PATH=/:" + filepath.Dir(ti.binary)}, ti.env...)
	cf.Config.User = ti.user
	return mutate.ConfigFile(img, cf)
}

// binaryLayer is a layer holding one executable at path, the extra files
// (by path without the leading slash), the directories runc expects to
// mount over, and for a non-root user an /etc/passwd naming it.
func binaryLayer(src, path, user string, extra map[string][]byte) (v1.Layer, error) {
	data, err := os.ReadFile(src)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := []string{"dev/", "proc/", "sys/", "etc/", "var/", "var/run/", "tmp/"}
	for _, f := range append(slices.Collect(maps.Keys(extra)), path[1:]) {
		for d := filepath.Dir(f); d != "."; d = filepath.Dir(d) {
			dirs = append(dirs, d+"/")
		}
	}
	slices.Sort(dirs)
	for _, d := range slices.Compact(dirs) {
		mode := int64(0o755)
		if d == "tmp/" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: mode}); err != nil {
			return nil, err
		}
	}
	files := map[string][]byte{path[1:]: data}
	maps.Copy(files, extra)
	if uid, gid, ok := strings.Cut(user, ":"); ok && uid != "0" {
		files["etc/passwd"] = fmt.Appendf(nil, "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%s:%s:nonroot:/home/nonroot:/sbin/nologin\n", uid, gid)
		files["etc/group"] = fmt.Appendf(nil, "root:x:0:\nnonroot:x:%s:\n", gid)
	}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		mode := int64(0o755)
		if strings.HasPrefix(name, "etc/") {
			mode = 0o644
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(files[name]))}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(files[name]); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	raw := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(raw)), nil })
}
