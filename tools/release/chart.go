package release

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	"go.yaml.in/yaml/v3"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/registry"
)

// chartImageValues are the chart's values that select each image.
var chartImageValues = map[string]string{"gpuguard": "webhook", "gpuguard-agent": "agent"}

// PushedChart is the chart in a registry.
type PushedChart struct {
	// Ref is what helm install takes: oci://REGISTRY/charts/gpuguard.
	Ref     string
	Version string
	Digest  string
}

// PushChart packages the chart at chartDir with its default images set to
// images (repository and digest, so an install runs exactly what was
// pushed, whatever the tag becomes later) and pushes it to
// REGISTRY/charts/NAME:VERSION.
func PushChart(chartDir, registryHost string, images []Pushed, client *registry.Client) (PushedChart, error) {
	c, err := loader.Load(chartDir)
	if err != nil {
		return PushedChart{}, err
	}
	for _, f := range c.Raw {
		if f.Name == chartutil.ValuesfileName {
			if f.Data, err = pinImages(f.Data, images); err != nil {
				return PushedChart{}, fmt.Errorf("%s: %w", filepath.Join(chartDir, f.Name), err)
			}
		}
	}
	tmp, err := os.MkdirTemp("", "gpuguard-chart-")
	if err != nil {
		return PushedChart{}, err
	}
	defer os.RemoveAll(tmp)
	archive, err := chartutil.Save(c, tmp)
	if err != nil {
		return PushedChart{}, err
	}
	data, err := os.ReadFile(archive)
	if err != nil {
		return PushedChart{}, err
	}
	repo := registryHost + "/charts/" + c.Metadata.Name
	res, err := client.Push(data, repo+":"+c.Metadata.Version)
	if err != nil {
		return PushedChart{}, fmt.Errorf("pushing the chart to %s: %w", repo, err)
	}
	return PushedChart{Ref: "oci://" + repo, Version: c.Metadata.Version, Digest: res.Manifest.Digest}, nil
}

// pinImages sets IMAGE.image.repository and .digest in the values file for
// each pushed image, keeping its comments and layout.
func pinImages(values []byte, images []Pushed) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(values, &doc); err != nil {
		return nil, err
	}
	for _, img := range images {
		key, ok := chartImageValues[img.Name]
		if !ok {
			return nil, fmt.Errorf("no chart value selects image %s", img.Name)
		}
		image := lookup(doc.Content[0], key, "image")
		if image == nil {
			return nil, fmt.Errorf("no %s.image", key)
		}
		for field, value := range map[string]string{"repository": img.Repository, "digest": img.Digest.String()} {
			node := lookup(image, field)
			if node == nil || node.Kind != yaml.ScalarNode {
				return nil, fmt.Errorf("no %s.image.%s", key, field)
			}
			node.Value, node.Style = value, 0
		}
	}
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, err
	}
	return out.Bytes(), enc.Close()
}

// lookup follows keys through nested mappings.
func lookup(n *yaml.Node, keys ...string) *yaml.Node {
	for _, k := range keys {
		if n == nil || n.Kind != yaml.MappingNode {
			return nil
		}
		var next *yaml.Node
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == k {
				next = n.Content[i+1]
			}
		}
		n = next
	}
	return n
}
