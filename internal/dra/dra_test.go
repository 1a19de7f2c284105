package dra

import "testing"

func TestParseGPUDevice(t *testing.T) {
	for _, tc := range []struct {
		name       string
		minor      int
		mig, known bool
	}{
		{"gpu-0", 0, false, true},
		{"gpu-7", 7, false, true},
		{"gpu-3-mig-1g5gb-19-4", 3, true, true},
		{"gpu-3-mig-19-4-1", 3, true, true}, // v25.8.1's MIG names
		{"gpu-vfio-0", 0, false, false},
		{"gpu--1", 0, false, false},
		{"gpu-01", 0, false, false},
		{"gpu-2-other", 0, false, false},
		{"channel-0", 0, false, false},
		{"gpu-", 0, false, false},
	} {
		minor, mig, ok := ParseGPUDevice(tc.name)
		if ok != tc.known || minor != tc.minor || mig != tc.mig {
			t.Errorf("ParseGPUDevice(%q) = %d, %v, %v; want %d, %v, %v", tc.name, minor, mig, ok, tc.minor, tc.mig, tc.known)
		}
	}
}

func TestNVIDIADriver(t *testing.T) {
	for driver, want := range map[string]bool{"gpu.nvidia.com": true, "compute-domain.nvidia.com": true,
		"notnvidia.com": false, "example.com": false, "": false} {
		if got := NVIDIADriver(driver); got != want {
			t.Errorf("NVIDIADriver(%q) = %v, want %v", driver, got, want)
		}
	}
}
