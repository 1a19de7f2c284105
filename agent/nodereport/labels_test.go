package nodereport

import (
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gpuguard/gpuguard/internal/wellknown"
)

func TestReportLabels(t *testing.T) {
	cases := []struct {
		scenario, version, hardened string
		check                       string
		want                        Status
	}{
		{"hardened", "1.17.8", "true", CheckEnvvarUnprivileged, Pass},
		{"default", "1.18.1", "false", CheckEnvvarUnprivileged, Fail},
		{"default", "1.18.1", "false", CheckNRIPlugin, Unknown},
	}
	for _, tc := range cases {
		r := collect(t, tc.scenario, tc.version)
		labels := r.Labels()
		if labels[wellknown.HardenedMarkLabel] != tc.hardened {
			t.Errorf("%s: %s=%q, want %q", tc.scenario, wellknown.HardenedMarkLabel, labels[wellknown.HardenedMarkLabel], tc.hardened)
		}
		if labels[wellknown.HardenedLabel] != tc.hardened {
			t.Errorf("%s: %s=%q, want %q", tc.scenario, wellknown.HardenedLabel, labels[wellknown.HardenedLabel], tc.hardened)
		}
		if got := labels[wellknown.CheckLabelPrefix+tc.check]; got != string(tc.want) {
			t.Errorf("%s: check %s label %q, want %q", tc.scenario, tc.check, got, tc.want)
		}
		if len(labels) != len(r.Checks)+2 { // a label per check, the summary and its mark
			t.Errorf("%s: %d labels for %d checks", tc.scenario, len(labels), len(r.Checks))
		}
		// The API server rejects a node patch with one invalid label.
		for k, v := range labels {
			if errs := validation.IsQualifiedName(k); len(errs) > 0 {
				t.Errorf("label key %q: %v", k, errs)
			}
			if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
				t.Errorf("label %s value %q: %v", k, v, errs)
			}
		}
	}
}
