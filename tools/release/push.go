package release

import (
	"context"
	"fmt"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Pushed is an image index in a registry.
type Pushed struct {
	Name string
	// Repository is REGISTRY/NAME.
	Repository string
	Tag        string
	Digest     v1.Hash
}

// Ref is the index by digest: REGISTRY/NAME@sha256:....
func (p Pushed) Ref() string { return p.Repository + "@" + p.Digest.String() }

// Push copies the OCI layout at dir (as Build wrote it) to registry, a
// host[:port] with an optional path: each index as REGISTRY/NAME:TAG, each
// SBOM as a referrer of its image in the same repository. nameOpts are for
// the registry's name (name.Insecure for plain HTTP).
func Push(ctx context.Context, dir, registry string, nameOpts []name.Option, opts ...remote.Option) ([]Pushed, error) {
	lp, err := layout.FromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("%s is not an OCI image layout (make images writes one): %w", dir, err)
	}
	root, err := lp.ImageIndex()
	if err != nil {
		return nil, err
	}
	manifest, err := root.IndexManifest()
	if err != nil {
		return nil, err
	}
	opts = append(opts, remote.WithContext(ctx))
	var pushed []Pushed
	repoOf := map[v1.Hash]name.Repository{} // platform image → its repository
	for _, desc := range manifest.Manifests {
		ref := desc.Annotations[refNameAnnotation]
		if ref == "" {
			continue
		}
		p, repo, platforms, err := pushIndex(root, desc, ref, registry, nameOpts, opts)
		if err != nil {
			return nil, err
		}
		for _, h := range platforms {
			repoOf[h] = repo
		}
		pushed = append(pushed, p)
	}
	for _, desc := range manifest.Manifests {
		if desc.ArtifactType != SBOMMediaType {
			continue
		}
		if err := pushReferrer(root, desc, repoOf, opts); err != nil {
			return nil, err
		}
	}
	if len(pushed) == 0 {
		return nil, fmt.Errorf("%s holds no named image index", dir)
	}
	return pushed, nil
}

func pushIndex(root v1.ImageIndex, desc v1.Descriptor, ref, registry string, nameOpts []name.Option, opts []remote.Option) (Pushed, name.Repository, []v1.Hash, error) {
	var repo name.Repository
	imageName, tagName, ok := strings.Cut(ref, ":")
	if !ok {
		return Pushed{}, repo, nil, fmt.Errorf("layout entry %q: want NAME:TAG", ref)
	}
	tag, err := name.NewTag(registry+"/"+imageName+":"+tagName, nameOpts...)
	if err != nil {
		return Pushed{}, repo, nil, fmt.Errorf("registry %q: %w", registry, err)
	}
	idx, err := root.ImageIndex(desc.Digest)
	if err != nil {
		return Pushed{}, repo, nil, err
	}
	if err := remote.WriteIndex(tag, idx, opts...); err != nil {
		return Pushed{}, repo, nil, fmt.Errorf("pushing %s: %w", tag, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return Pushed{}, repo, nil, err
	}
	var platforms []v1.Hash
	for _, m := range im.Manifests {
		platforms = append(platforms, m.Digest)
	}
	repo = tag.Context()
	return Pushed{Name: imageName, Repository: repo.Name(), Tag: tagName, Digest: desc.Digest}, repo, platforms, nil
}

// pushReferrer pushes an SBOM artifact by digest into the repository of
// the image it describes.
func pushReferrer(root v1.ImageIndex, desc v1.Descriptor, repoOf map[v1.Hash]name.Repository, opts []remote.Option) error {
	artifact, err := root.Image(desc.Digest)
	if err != nil {
		return err
	}
	m, err := artifact.Manifest()
	if err != nil {
		return err
	}
	if m.Subject == nil {
		return fmt.Errorf("SBOM %s names no subject", desc.Digest)
	}
	repo, ok := repoOf[m.Subject.Digest]
	if !ok {
		return fmt.Errorf("SBOM %s describes %s, which no index of the layout holds", desc.Digest, m.Subject.Digest)
	}
	if err := remote.Write(repo.Digest(desc.Digest.String()), artifact, opts...); err != nil {
		return fmt.Errorf("pushing the SBOM of %s@%s: %w", repo, m.Subject.Digest, err)
	}
	return nil
}
