package config

import (
	"slices"
	"testing"
)

func TestPolicyNames(t *testing.T) {
	s := &PolicySpec{
		GPUResources: []string{"nvidia.com/gpu", "nvidia.com/mig-*", "example.com/gpu?", "nvidia.com/[ab]"},
		Env: EnvPolicy{
			ExtraDeviceVariables: []string{"NVIDIA_MIG_CONFIG_DEVICES"},
			ProtectedVariables:   []ProtectedVariable{{Name: "NVIDIA_DRIVER_CAPABILITIES"}},
		},
	}
	if got, want := s.DeviceVariables(), []string{VisibleDevicesEnv, "NVIDIA_MIG_CONFIG_DEVICES"}; !slices.Equal(got, want) {
		t.Errorf("DeviceVariables() = %v, want %v", got, want)
	}
	if got, want := s.ProtectedNames(), []string{VisibleDevicesEnv, "NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"}; !slices.Equal(got, want) {
		t.Errorf("ProtectedNames() = %v, want %v", got, want)
	}
	exact, globs := s.GPUResourcePatterns()
	if !slices.Equal(exact, []string{"nvidia.com/gpu"}) || !slices.Equal(globs, []string{"nvidia.com/mig-*", "example.com/gpu?", "nvidia.com/[ab]"}) {
		t.Errorf("GPUResourcePatterns() = %v, %v", exact, globs)
	}
	// The device variables are a fresh slice each time: appending to one
	// must not change the policy's extra variables.
	_ = append(s.DeviceVariables()[:1], "X")
	if s.Env.ExtraDeviceVariables[0] != "NVIDIA_MIG_CONFIG_DEVICES" {
		t.Error("DeviceVariables aliases the policy's slice")
	}
}
