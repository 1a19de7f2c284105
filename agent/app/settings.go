package app

import (
	"fmt"
	"time"

	"github.com/gpuguard/gpuguard/agent/cdispec"
	"github.com/gpuguard/gpuguard/agent/rm"
	"github.com/gpuguard/gpuguard/agent/strategy"
	"github.com/gpuguard/gpuguard/agent/verifier"
)

// The values each enumerated setting takes; the flags refuse others when
// they are parsed, and Validate refuses them in a Config built in code.
var (
	devicePluginModes = []string{PluginAuto, PluginOn, PluginOff}
	idStrategies      = []string{string(strategy.IDUUID), string(strategy.IDIndex)}
	migStrategies     = []string{rm.MIGNone, rm.MIGMixed}
	cdiSpecModes      = []string{cdispec.ModeAuto, cdispec.ModeToolkit, cdispec.ModeOwn}
	verifyModes       = []string{verifier.ModeOff, verifier.ModeReport, verifier.ModeEnforce}
)

// Validate checks the whole configuration once, before anything starts: a
// bad value stops the agent with a message naming the setting (its flag's
// name). The policy file is not checked here: a policy edit, or one written
// for a newer gpuguard, must never keep the agent (and its device plugin)
// from starting; the verifier keeps the last policy it could read.
func (c Config) Validate() error {
	for _, e := range []struct {
		setting, value string
		allowed        []string
	}{
		{"device-plugin", c.DevicePlugin, devicePluginModes},
		{"device-id-strategy", c.DeviceIDStrategy, idStrategies},
		{"mig-strategy", c.MIGStrategy, migStrategies},
		{"cdi-spec", c.CDISpec, cdiSpecModes},
		{"verify", c.Verify, verifyModes},
	} {
		if err := oneOf(e.value, e.allowed...); err != nil {
			return fmt.Errorf("%s %w", e.setting, err)
		}
	}
	if _, err := strategy.Parse(c.DeviceListStrategy); err != nil {
		return fmt.Errorf("device-list-strategy: %w", err)
	}
	if err := c.timeSlicing().Validate(); err != nil {
		return err
	}
	if c.RetryInterval <= 0 {
		return fmt.Errorf("retry-interval %s: want a positive duration", c.RetryInterval)
	}
	if c.HardeningInterval < 0 {
		return fmt.Errorf("hardening-interval %s: want a duration of 0 (only at start) or more", c.HardeningInterval)
	}
	if c.VerifyInterval < time.Second {
		return fmt.Errorf("verify-interval %s: want a duration of at least 1s", c.VerifyInterval)
	}
	return nil
}

func (c Config) timeSlicing() rm.TimeSlicing {
	return rm.TimeSlicing{Replicas: c.TimeSlicingReplicas, Rename: c.TimeSlicingRename}
}

// settings are what the agent derives from a valid Config, once.
type settings struct {
	ids         strategy.IDStrategy
	ignoredXIDs map[uint64]bool
	timeSlicing rm.TimeSlicing
}

func (c Config) parse() (settings, error) {
	if err := c.Validate(); err != nil {
		return settings{}, err
	}
	s := settings{ids: strategy.IDStrategy(c.DeviceIDStrategy), ignoredXIDs: map[uint64]bool{}, timeSlicing: c.timeSlicing()}
	for _, x := range c.IgnoredXIDs {
		s.ignoredXIDs[x] = true
	}
	return s, nil
}
