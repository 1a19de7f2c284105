package celexpr

import "testing"

func TestGlobToRegexp(t *testing.T) {
	for glob, want := range map[string]string{
		"nvidia.com/mig-*":  `^nvidia\.com/mig-[^/]*$`,
		"example.com/gpu-?": `^example\.com/gpu-[^/]$`,
	} {
		if got, err := GlobToRegexp(glob); err != nil || got != want {
			t.Errorf("%s: %q, %v; want %q", glob, got, err, want)
		}
	}
	if _, err := GlobToRegexp("nvidia.com/[ab]"); err == nil {
		t.Error("a character class must be refused, not approximated")
	}
}
