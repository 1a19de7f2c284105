package discovery

import (
	"strconv"
	"strings"
)

func itoa(i int) string { return strconv.Itoa(i) }

// cString converts a NUL-terminated C char array to a Go string.
func cString(b []int8) string {
	var sb strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	return sb.String()
}

// normalizePCIBusID lower-cases a PCI bus ID and gives it a 4-digit domain:
// NVML reports "00000000:07:00.0", sysfs names it "0000:07:00.0".
func normalizePCIBusID(id string) string {
	id = strings.ToLower(strings.TrimSpace(id))
	if i := strings.Index(id, ":"); i > 4 && strings.Trim(id[:i-4], "0") == "" {
		id = id[i-4:]
	}
	return id
}
