package app

import (
	"fmt"
	"time"

	"github.com/gpuguard/gpuguard/agent/health"
	"github.com/gpuguard/gpuguard/agent/rm"
	"github.com/gpuguard/gpuguard/agent/strategy"
	"github.com/gpuguard/gpuguard/agent/verifier"
)

// settings are the flags that need parsing, parsed once when the agent is
// made: a bad value stops it, with a message naming the flag, before
// anything starts, and nothing parses them again.
type settings struct {
	ids            strategy.IDStrategy
	ignoredXIDs    map[uint64]bool
	retry          time.Duration
	verifyInterval time.Duration
	timeSlicing    rm.TimeSlicing
}

func (c Config) parse() (settings, error) {
	var s settings
	var err error
	switch c.DevicePlugin {
	case PluginAuto, PluginOn, PluginOff:
	default:
		return s, fmt.Errorf("--device-plugin=%s: want auto, on or off", c.DevicePlugin)
	}
	if _, err := strategy.Parse(c.DeviceListStrategy); err != nil {
		return s, err
	}
	if s.ids, err = strategy.ParseIDStrategy(c.DeviceIDStrategy); err != nil {
		return s, err
	}
	if c.MIGStrategy != rm.MIGNone && c.MIGStrategy != rm.MIGMixed {
		return s, fmt.Errorf("--mig-strategy=%s: want none or mixed", c.MIGStrategy)
	}
	s.timeSlicing = rm.TimeSlicing{Replicas: c.TimeSlicingReplicas, Rename: c.TimeSlicingRename}
	if err := s.timeSlicing.Validate(); err != nil {
		return s, err
	}
	if s.ignoredXIDs, err = health.ParseXIDs(c.IgnoredXIDs); err != nil {
		return s, err
	}
	if s.retry, err = time.ParseDuration(c.RetryInterval); err != nil {
		return s, fmt.Errorf("--retry-interval: %w", err)
	}
	switch c.Verify {
	case verifier.ModeOff, verifier.ModeReport, verifier.ModeEnforce:
	default:
		return s, fmt.Errorf("--verify=%s: want off, report or enforce", c.Verify)
	}
	if s.verifyInterval, err = time.ParseDuration(c.VerifyInterval); err != nil || s.verifyInterval < time.Second {
		return s, fmt.Errorf("--verify-interval=%s: want a duration of at least 1s", c.VerifyInterval)
	}
	// The policy file is not checked here: a policy edit, or one written for a
	// newer gpuguard, must never keep the agent (and its device plugin) from
	// starting. The verifier keeps the last policy it could read.
	return s, nil
}
