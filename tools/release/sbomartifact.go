package release

import (
	"bytes"
	"encoding/json"
	"io"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// emptyJSON is the OCI empty descriptor's content: the configuration of an
// artifact that has none (OCI image spec 1.1, "Guidance for an empty
// descriptor").
var emptyJSON = []byte("{}")

const emptyMediaType types.MediaType = "application/vnd.oci.empty.v1+json"

// writeSBOM puts doc into the layout as an OCI 1.1 artifact whose subject is
// the image subject describes: a registry lists it among that image's
// referrers (oras discover, cosign tree, the referrers API).
func writeSBOM(lp layout.Path, doc []byte, subject v1.Descriptor) error {
	config, err := writeBlob(lp, emptyJSON, emptyMediaType)
	if err != nil {
		return err
	}
	layer, err := writeBlob(lp, doc, SBOMMediaType)
	if err != nil {
		return err
	}
	layer.Annotations = map[string]string{"org.opencontainers.image.title": "sbom.spdx.json"}
	subject.Platform = nil
	manifest, err := json.Marshal(v1.Manifest{
		SchemaVersion: 2, MediaType: types.OCIManifestSchema1, ArtifactType: SBOMMediaType,
		Config: config, Layers: []v1.Descriptor{layer}, Subject: &subject,
	})
	if err != nil {
		return err
	}
	desc, err := writeBlob(lp, manifest, types.OCIManifestSchema1)
	if err != nil {
		return err
	}
	desc.ArtifactType = SBOMMediaType
	return lp.AppendDescriptor(desc)
}

func writeBlob(lp layout.Path, data []byte, mt types.MediaType) (v1.Descriptor, error) {
	h, size, err := v1.SHA256(bytes.NewReader(data))
	if err != nil {
		return v1.Descriptor{}, err
	}
	if err := lp.WriteBlob(h, io.NopCloser(bytes.NewReader(data))); err != nil {
		return v1.Descriptor{}, err
	}
	return v1.Descriptor{MediaType: mt, Digest: h, Size: size}, nil
}
