// Package charts holds gpuguard's Helm chart: embedded here, so that the
// gpuguard CLI renders the policy a team's values install with the chart
// itself; its tests check the chart with the Helm SDK.
package charts

import (
	"embed"
	"io/fs"
)

// chartFiles is the chart directory. all: keeps the files whose names start with
// an underscore (_helpers.tpl), which Helm reads as named templates.
//
//go:embed all:gpuguard
var chartFiles embed.FS

// GPUGuard returns the gpuguard chart's files, rooted at the chart directory.
func GPUGuard() fs.FS {
	sub, err := fs.Sub(chartFiles, "gpuguard")
	if err != nil {
		// fs.Sub fails only on an invalid path, and this one is constant.
		panic(err)
	}
	return sub
}
