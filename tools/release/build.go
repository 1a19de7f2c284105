package release

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Built is an image index Build wrote to the layout.
type Built struct {
	Name string
	// Tag is the chart's appVersion.
	Tag    string
	Digest v1.Hash
	// Platforms are the digests of each platform's image, in index order.
	Platforms map[string]v1.Hash
}

// refNameAnnotation names an index in an OCI image layout.
const refNameAnnotation = "org.opencontainers.image.ref.name"

// Build builds each spec for platforms into a fresh OCI image layout at
// dir: one image index a spec, named NAME:VERSION, and beside each
// platform's image its SBOM, an artifact whose subject is that image. Go's
// build directory for the binaries is workDir.
func Build(ctx context.Context, src Source, specs []Spec, platforms []Platform, dir, workDir string) ([]Built, error) {
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return nil, err
	}
	var built []Built
	for _, spec := range specs {
		b, err := buildIndex(ctx, src, spec, platforms, lp, workDir)
		if err != nil {
			return nil, err
		}
		built = append(built, b)
	}
	return built, nil
}

func buildIndex(ctx context.Context, src Source, spec Spec, platforms []Platform, lp layout.Path, workDir string) (Built, error) {
	b := Built{Name: spec.Name, Tag: src.Version, Platforms: map[string]v1.Hash{}}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range platforms {
		bin, err := buildBinary(ctx, src, spec, p, workDir)
		if err != nil {
			return b, err
		}
		img, doc, err := platformImage(src, spec, p, bin)
		if err != nil {
			return b, fmt.Errorf("%s for %s: %w", spec.Name, p, err)
		}
		desc, err := imageDescriptor(img, p)
		if err != nil {
			return b, err
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: desc})
		// The image's blobs go in now; the layout's index lists only
		// indexes and SBOMs, as a registry's tags and referrers would.
		if err := lp.WriteImage(img); err != nil {
			return b, err
		}
		if err := writeSBOM(lp, doc, desc); err != nil {
			return b, err
		}
		b.Platforms[p.String()] = desc.Digest
	}
	idx = mutate.Annotations(idx, src.annotations(spec)).(v1.ImageIndex)
	err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{refNameAnnotation: spec.Name + ":" + src.Version}))
	if err != nil {
		return b, err
	}
	b.Digest, err = idx.Digest()
	return b, err
}

// imageDescriptor is img's entry in an index, platform included.
func imageDescriptor(img v1.Image, p Platform) (v1.Descriptor, error) {
	digest, err := img.Digest()
	if err != nil {
		return v1.Descriptor{}, err
	}
	size, err := img.Size()
	if err != nil {
		return v1.Descriptor{}, err
	}
	return v1.Descriptor{MediaType: types.OCIManifestSchema1, Digest: digest, Size: size,
		Platform: &v1.Platform{OS: p.OS, Architecture: p.Arch}}, nil
}

// annotations are the OCI annotations of an image and its index.
func (src Source) annotations(spec Spec) map[string]string {
	a := map[string]string{
		"org.opencontainers.image.title":       spec.Name,
		"org.opencontainers.image.description": spec.Description,
		"org.opencontainers.image.version":     src.Version,
		"org.opencontainers.image.created":     src.Epoch.UTC().Format("2006-01-02T15:04:05Z"),
		"org.opencontainers.image.licenses":    "Apache-2.0",
	}
	if src.URL != "" {
		a["org.opencontainers.image.source"] = src.URL
	}
	if src.Revision != "" {
		a["org.opencontainers.image.revision"] = src.Revision
	}
	return a
}

// platformImage is spec's image for p, with bin as its program, and the
// image's SBOM.
func platformImage(src Source, spec Spec, p Platform, bin string) (v1.Image, []byte, error) {
	base, debs, err := baseTree(spec, p, bin)
	if err != nil {
		return nil, nil, err
	}
	program, err := os.ReadFile(bin)
	if err != nil {
		return nil, nil, err
	}
	app := tree{}
	app.file(spec.Binary, 0o755, program)
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	for _, layer := range []struct {
		t   tree
		why string
	}{{base, "users, directories and the C library"}, {app, spec.Binary}} {
		l, err := layer.t.layer(src.Epoch)
		if err != nil {
			return nil, nil, err
		}
		img, err = mutate.Append(img, mutate.Addendum{Layer: l, MediaType: types.OCILayer,
			History: v1.History{Created: v1.Time{Time: src.Epoch}, CreatedBy: "gpuguard release: " + layer.why}})
		if err != nil {
			return nil, nil, err
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Created = p.OS, p.Arch, v1.Time{Time: src.Epoch}
	cf.Config.Entrypoint = []string{spec.Binary}
	cf.Config.User = spec.User
	cf.Config.WorkingDir = "/"
	cf.Config.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
	cf.Config.Labels = src.annotations(spec)
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, nil, err
	}
	img = mutate.Annotations(img, src.annotations(spec)).(v1.Image)
	doc, err := sbom(src, spec, p, bin, debs)
	return img, doc, err
}

// baseTree is what an image has besides its program: the directories
// runtimes mount over, a world-writable /tmp, the users, and for a cgo
// program its C library with the Debian release it came from.
func baseTree(spec Spec, p Platform, bin string) (tree, []debPackage, error) {
	t := tree{}
	for _, d := range []string{"/dev", "/proc", "/sys", "/etc", "/var/run"} {
		t.dir(d, 0o755, 0, 0)
	}
	t.dir("/root", 0o700, 0, 0)
	t.dir("/tmp", 0o1777, 0, 0)
	uid, gid, err := parseUser(spec.User)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", spec.Name, err)
	}
	passwd := "root:x:0:0:root:/root:/sbin/nologin\n"
	group := "root:x:0:\n"
	if uid != 0 {
		passwd += fmt.Sprintf("nonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", uid, gid)
		group += fmt.Sprintf("nonroot:x:%d:\n", gid)
		t.dir("/home/nonroot", 0o700, uid, gid)
	}
	t.file("/etc/passwd", 0o644, []byte(passwd))
	t.file("/etc/group", 0o644, []byte(group))
	if !spec.CGO {
		return t, nil, nil
	}
	debs, err := addCLibrary(t, bin, p)
	if err != nil {
		return nil, nil, err
	}
	// Scanners read the distribution of the packages under
	// /var/lib/dpkg/status.d from os-release: the build machine's Debian.
	osRelease, err := os.ReadFile("/etc/os-release")
	if err != nil {
		return nil, nil, fmt.Errorf("the C library comes from this machine's Debian release, which has no /etc/os-release: %w", err)
	}
	t.file("/etc/os-release", 0o644, osRelease)
	for i := range debs {
		debs[i].Distro = osReleaseID(osRelease)
	}
	return t, debs, nil
}

// osReleaseID is os-release's ID (debian, ubuntu), the namespace of a
// package URL for the distribution's packages.
func osReleaseID(osRelease []byte) string {
	for _, line := range strings.Split(string(osRelease), "\n") {
		if id, ok := strings.CutPrefix(line, "ID="); ok {
			return strings.Trim(id, `"`)
		}
	}
	return "debian"
}

func parseUser(user string) (uid, gid int, err error) {
	u, g, ok := strings.Cut(user, ":")
	if ok {
		uid, err = strconv.Atoi(u)
		if err == nil {
			gid, err = strconv.Atoi(g)
		}
	}
	if !ok || err != nil {
		return 0, 0, fmt.Errorf("user %q: want numeric uid:gid", user)
	}
	return uid, gid, nil
}
