package release

import (
	"bytes"
	"crypto/sha256"
	"debug/buildinfo"
	"fmt"
	"regexp"
	"strings"
	"time"

	spdxjson "github.com/spdx/tools-golang/json"
	"github.com/spdx/tools-golang/spdx/v2/common"
	spdx "github.com/spdx/tools-golang/spdx/v2/v2_3"
)

// SBOMMediaType is the artifact type of the SBOM attached to each image.
const SBOMMediaType = "application/spdx+json"

// sbom is the SPDX 2.3 document of one platform's image: the image, the Go
// program in it with its toolchain and every module linked into it (read
// from the binary's own build information, so it is what was compiled, not
// what go.mod lists), and the Debian packages whose files it carries.
func sbom(src Source, spec Spec, p Platform, bin string, debs []debPackage) ([]byte, error) {
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		return nil, fmt.Errorf("reading the build information of %s: %w", bin, err)
	}
	image := &spdx.Package{
		PackageName: spec.Name, PackageSPDXIdentifier: "Image", PackageVersion: src.Version,
		PackageDownloadLocation: "NOASSERTION", PrimaryPackagePurpose: "CONTAINER",
		PackageDescription: spec.Description + ", " + p.String(),
	}
	doc := &spdx.Document{
		SPDXVersion: spdx.Version, DataLicense: spdx.DataLicense, SPDXIdentifier: "DOCUMENT",
		DocumentName: spec.Name + "-" + src.Version + "-" + p.OS + "-" + p.Arch,
		CreationInfo: &spdx.CreationInfo{
			Created:  src.Epoch.UTC().Format(time.RFC3339),
			Creators: []common.Creator{{CreatorType: "Tool", Creator: "gpuguard-release-" + src.Version}},
		},
		Packages: []*spdx.Package{image},
	}
	contains := func(pkg *spdx.Package) {
		doc.Packages = append(doc.Packages, pkg)
		doc.Relationships = append(doc.Relationships, &spdx.Relationship{
			RefA: common.MakeDocElementID("", "Image"), RefB: common.MakeDocElementID("", string(pkg.PackageSPDXIdentifier)),
			Relationship: common.TypeRelationshipContains,
		})
	}
	doc.Relationships = append(doc.Relationships, &spdx.Relationship{
		RefA: common.MakeDocElementID("", "DOCUMENT"), RefB: common.MakeDocElementID("", "Image"),
		Relationship: common.TypeRelationshipDescribe,
	})
	contains(goPackage("go", "stdlib", info.GoVersion, ""))
	mainVersion := src.Version
	if src.Revision != "" {
		mainVersion += "+" + src.Revision
	}
	contains(goPackage(info.Main.Path, info.Main.Path, mainVersion, src.URL))
	for _, dep := range info.Deps {
		if dep.Replace != nil {
			dep = dep.Replace
		}
		contains(goPackage(dep.Path, dep.Path, dep.Version, ""))
	}
	for _, deb := range debs {
		contains(debianPackage(deb))
	}
	return encodeSBOM(doc)
}

// encodeSBOM names the document by its own content, as SPDX asks for a
// unique namespace: a build that changes nothing keeps the name.
func encodeSBOM(doc *spdx.Document) ([]byte, error) {
	var body bytes.Buffer
	if err := spdxjson.Write(doc, &body); err != nil {
		return nil, err
	}
	sum := sha256.Sum256(body.Bytes())
	doc.DocumentNamespace = fmt.Sprintf("https://spdx.org/spdxdocs/%s-%x", doc.DocumentName, sum[:8])
	body.Reset()
	if err := spdxjson.Write(doc, &body, spdxjson.Indent("  ")); err != nil {
		return nil, err
	}
	return body.Bytes(), nil
}

var nonIDChars = regexp.MustCompile(`[^A-Za-z0-9.-]+`)

// spdxID makes an SPDX element identifier from parts.
func spdxID(parts ...string) common.ElementID {
	return common.ElementID(nonIDChars.ReplaceAllString(strings.Join(parts, "-"), "-"))
}

func goPackage(name, purlPath, version, home string) *spdx.Package {
	return &spdx.Package{
		PackageName: name, PackageSPDXIdentifier: spdxID("Go", name, version), PackageVersion: version,
		PackageDownloadLocation: "NOASSERTION", PackageHomePage: home, PrimaryPackagePurpose: "LIBRARY",
		PackageExternalReferences: []*spdx.PackageExternalReference{{
			Category: common.CategoryPackageManager, RefType: common.TypePackageManagerPURL,
			Locator: "pkg:golang/" + purlPath + "@" + version,
		}},
	}
}

func debianPackage(deb debPackage) *spdx.Package {
	return &spdx.Package{
		PackageName: deb.Name, PackageSPDXIdentifier: spdxID("Deb", deb.Name, deb.Arch, deb.Version), PackageVersion: deb.Version,
		PackageDownloadLocation: "NOASSERTION", PackageSourceInfo: "source package " + deb.Source,
		PrimaryPackagePurpose: "OPERATING-SYSTEM",
		PackageExternalReferences: []*spdx.PackageExternalReference{{
			Category: common.CategoryPackageManager, RefType: common.TypePackageManagerPURL,
			Locator: fmt.Sprintf("pkg:deb/%s/%s@%s?arch=%s", deb.Distro, deb.Name, deb.Version, deb.Arch),
		}},
	}
}
