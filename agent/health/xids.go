// Package health watches NVML for XID critical errors and reports devices
// that became unhealthy.
package health

import (
	"fmt"
	"strconv"
	"strings"
)

// DefaultIgnoredXIDs are application errors after which the GPU is still
// healthy: 13 (graphics engine exception), 31 (GPU memory page fault),
// 43 (GPU stopped processing), 45 (preemptive cleanup), 68 (video
// processor exception), 109 (context switch timeout).
var DefaultIgnoredXIDs = []uint64{13, 31, 43, 45, 68, 109}

// ParseXIDs reads a comma list of XIDs; "" and "none" give an empty set.
func ParseXIDs(s string) (map[uint64]bool, error) {
	out := map[uint64]bool{}
	s = strings.TrimSpace(s)
	if s == "" || s == "none" {
		return out, nil
	}
	for _, part := range strings.Split(s, ",") {
		x, err := strconv.ParseUint(strings.TrimSpace(part), 10, 32)
		if err != nil {
			return nil, fmt.Errorf("XID list %q: %q is not a number", s, part)
		}
		out[x] = true
	}
	return out, nil
}

// FormatXIDs renders XIDs as a comma list.
func FormatXIDs(xids []uint64) string {
	s := make([]string, len(xids))
	for i, x := range xids {
		s[i] = strconv.FormatUint(x, 10)
	}
	return strings.Join(s, ",")
}
