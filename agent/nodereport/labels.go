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
// keeps GPU workloads on hardened nodes. The summary is also written as
// wellknown.HardenedMarkLabel, which kubelets cannot set, for the webhook.
func (r *Report) Labels() map[string]string {
	hardened := strconv.FormatBool(r.Hardened())
	labels := map[string]string{wellknown.HardenedLabel: hardened, wellknown.HardenedMarkLabel: hardened}
	for _, c := range r.Checks {
		labels[wellknown.CheckLabelPrefix+c.ID] = string(c.Status)
	}
	return labels
}
