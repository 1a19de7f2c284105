// Command release builds gpuguard's images and publishes them with the
// Helm chart, without a container engine.
//
//	go run ./hack/release images [--out DIR] [--platforms linux/amd64,linux/arm64]
//	go run ./hack/release push --registry REGISTRY [--layout DIR] [--plain-http]
//	go run ./hack/release dist [--out DIR] [--platforms LIST] [--download-base URL]
//
// images writes both images, as multi-platform OCI image indexes with an
// SPDX SBOM attached to each platform's image, into an OCI image layout, and
// prints their digests. push copies that layout to REGISTRY (host[:port][/path])
// as REGISTRY/gpuguard:VERSION and REGISTRY/gpuguard-agent:VERSION, then
// pushes the chart, with both images pinned by digest in its values, to
// oci://REGISTRY/charts/gpuguard. Credentials are those of docker login and
// helm registry login; a registry with a private CA is trusted through
// SSL_CERT_FILE. dist writes the CLI's release archives (one per platform,
// the binary and the LICENSE), SHA256SUMS and the krew plugin manifest.
// `make images`, `make push REGISTRY=...` and `make dist` run these.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"helm.sh/helm/v3/pkg/registry"

	"github.com/gpuguard/gpuguard/tools/release"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "images":
		err = images(ctx, os.Args[2:])
	case "push":
		err = push(ctx, os.Args[2:])
	case "dist":
		err = dist(ctx, os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: release images [--out DIR] [--platforms LIST] | release push --registry REGISTRY [--layout DIR] [--plain-http] | release dist [--out DIR] [--platforms LIST] [--download-base URL]")
	os.Exit(2)
}

func images(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("images", flag.ExitOnError)
	out := fs.String("out", filepath.Join("_output", "images"), "OCI image layout to write (replaced)")
	platformList := fs.String("platforms", "linux/amd64,linux/arm64", "platforms to build, comma-separated")
	_ = fs.Parse(args)
	platforms, err := release.ParsePlatforms(*platformList)
	if err != nil {
		return err
	}
	src, work, err := sourceAndWorkDir("gpuguard-images-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	built, err := release.Build(ctx, src, release.Specs(), platforms, *out, work)
	if err != nil {
		return err
	}
	fmt.Printf("OCI image layout %s (dated %s):\n", *out, src.Epoch.Format("2006-01-02T15:04:05Z"))
	for _, b := range built {
		fmt.Printf("  %s:%s %s\n", b.Name, b.Tag, b.Digest)
		for _, p := range platforms {
			fmt.Printf("    %-12s %s\n", p, b.Platforms[p.String()])
		}
	}
	return nil
}

// sourceAndWorkDir reads the source tree from the working directory, which
// must be the repository root, and makes a scratch directory named after
// prefix for the build; the caller removes it.
func sourceAndWorkDir(prefix string) (release.Source, string, error) {
	root, err := os.Getwd()
	if err != nil {
		return release.Source{}, "", err
	}
	src, err := release.ReadSource(root)
	if err != nil {
		return release.Source{}, "", fmt.Errorf("run it from the repository root: %w", err)
	}
	work, err := os.MkdirTemp("", prefix)
	return src, work, err
}

func push(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("push", flag.ExitOnError)
	reg := fs.String("registry", "", "registry to push to: host[:port][/path]")
	dir := fs.String("layout", filepath.Join("_output", "images"), "OCI image layout that make images wrote")
	plainHTTP := fs.Bool("plain-http", false, "the registry speaks plain HTTP (a local one)")
	_ = fs.Parse(args)
	if *reg == "" {
		return fmt.Errorf("push needs --registry (make push REGISTRY=host[:port][/path])")
	}
	var nameOpts []name.Option
	helmOpts := []registry.ClientOption{registry.ClientOptWriter(os.Stderr)}
	if *plainHTTP {
		nameOpts = append(nameOpts, name.Insecure)
		helmOpts = append(helmOpts, registry.ClientOptPlainHTTP())
	}
	pushed, err := release.Push(ctx, *dir, *reg, nameOpts, remote.WithAuthFromKeychain(authn.DefaultKeychain))
	if err != nil {
		return err
	}
	for _, p := range pushed {
		fmt.Printf("%s:%s\n  %s\n", p.Repository, p.Tag, p.Ref())
	}
	client, err := registry.NewClient(helmOpts...)
	if err != nil {
		return err
	}
	chart, err := release.PushChart(filepath.Join("charts", "gpuguard"), *reg, pushed, client)
	if err != nil {
		return err
	}
	fmt.Printf("chart %s --version %s (%s)\n\nhelm install gpuguard %s --version %s -n gpuguard --wait\n",
		chart.Ref, chart.Version, chart.Digest, chart.Ref, chart.Version)
	return nil
}

func dist(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("dist", flag.ExitOnError)
	out := fs.String("out", filepath.Join("_output", "dist"), "directory to write the archives, SHA256SUMS and gpuguard.yaml to (replaced)")
	var all []string
	for _, p := range release.CLIPlatforms {
		all = append(all, p.String())
	}
	platformList := fs.String("platforms", strings.Join(all, ","), "platforms to build, comma-separated")
	base := fs.String("download-base", "", "URL the krew manifest downloads the archives from (default: the GitHub release of this version)")
	_ = fs.Parse(args)
	platforms, err := release.ParseCLIPlatforms(*platformList)
	if err != nil {
		return err
	}
	src, work, err := sourceAndWorkDir("gpuguard-dist-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	archives, err := release.Dist(ctx, src, platforms, *out, work, *base)
	if err != nil {
		return err
	}
	fmt.Printf("%s:\n", *out)
	for _, a := range archives {
		fmt.Printf("  %s  %s\n", a.SHA256, a.File)
	}
	fmt.Println("  SHA256SUMS\n  gpuguard.yaml (krew plugin manifest)")
	return nil
}
