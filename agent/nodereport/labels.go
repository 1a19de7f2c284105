package nodereport

import (
	"strconv"

	"github.com/gpuguard/gpuguard/internal/wellknown"
)

// LabelPrefix prefixes the node labels the report is published as.
const LabelPrefix = "gpuguard.io/"

// LabelHardened is the node label that sums up the report.
const LabelHardened = LabelPrefix + "hardened"

// Labels renders the report as node labels: wellknown.HardenedLabel ("true"
// or "false") and one wellknown.CheckLabelPrefix+<id> label per check with its
// status. A node selector or affinity on gpuguard.io/hardened=true then
// keeps GPU workloads on hardened nodes.
func (r *Report) Labels() map[string]string {
	labels := map[string]string{wellknown.HardenedLabel: strconv.FormatBool(r.Hardened())}
	for _, c := range r.Checks {
		labels[wellknown.CheckLabelPrefix+c.ID] = string(c.Status)
	}
	return labels
}
