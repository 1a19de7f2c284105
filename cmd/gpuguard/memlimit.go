package main

import (
	"os"
	"runtime/debug"
	"strconv"

	"github.com/go-logr/logr"
)

// memoryLimitEnv carries the container's memory limit in bytes; the chart
// sets it from the downward API (resourceFieldRef limits.memory).
const memoryLimitEnv = "GPUGUARD_MEMORY_LIMIT"

// setMemoryLimit gives the Go runtime a soft memory limit of 90% of the
// container's, so that the garbage collector works harder before the kernel
// kills the process; GOMEMLIMIT, when set, wins.
func setMemoryLimit(log logr.Logger) {
	if os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	raw := os.Getenv(memoryLimitEnv)
	if raw == "" {
		return
	}
	limit, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || limit <= 0 {
		log.Info("ignoring "+memoryLimitEnv+": want the limit in bytes", "value", raw)
		return
	}
	soft := limit / 10 * 9
	debug.SetMemoryLimit(soft)
	log.Info("Go memory limit set from the container's", "containerLimit", limit, "goMemoryLimit", soft)
}
