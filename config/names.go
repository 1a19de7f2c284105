package config

import (
	"path"
	"slices"
	"strings"
)

// The webhook's engine (policy/) and the CEL backstop (cel/) must agree on
// which variables and resources a policy names; both derive them here.

// DeviceVariables are the variables that hand a container devices:
// NVIDIA_VISIBLE_DEVICES first, then the policy's extra device variables.
func (s *PolicySpec) DeviceVariables() []string {
	return append([]string{VisibleDevicesEnv}, s.Env.ExtraDeviceVariables...)
}

// ProtectedNames are every variable the policy protects: the device
// variables, then the protected variables in policy order.
func (s *PolicySpec) ProtectedNames() []string {
	names := s.DeviceVariables()
	for _, v := range s.Env.ProtectedVariables {
		names = append(names, v.Name)
	}
	return names
}

// GPUResourcePatterns splits gpuResources into exact names and glob patterns
// (those with *, ?, [ or \, matched as path.Match does).
func (s *PolicySpec) GPUResourcePatterns() (exact, globs []string) {
	for _, r := range s.GPUResources {
		if IsGlob(r) {
			globs = append(globs, r)
		} else {
			exact = append(exact, r)
		}
	}
	return slices.Clip(exact), slices.Clip(globs)
}

// IsGlob reports whether a gpuResources entry is a pattern.
func IsGlob(resource string) bool { return strings.ContainsAny(resource, "*?[\\") }

// IsGPUResource reports whether a resource name is one of gpuResources, or
// matches one of its patterns.
func (s *PolicySpec) IsGPUResource(name string) bool {
	exact, globs := s.GPUResourcePatterns()
	if slices.Contains(exact, name) {
		return true
	}
	for _, g := range globs {
		if ok, _ := path.Match(g, name); ok {
			return true
		}
	}
	return false
}
