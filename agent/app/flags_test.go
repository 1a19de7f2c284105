package app

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func parseFlags(t *testing.T, args ...string) (Config, error) {
	t.Helper()
	c := DefaultConfig()
	fs := pflag.NewFlagSet("gpuguard-agent", pflag.ContinueOnError)
	fs.SetOutput(&strings.Builder{})
	c.AddFlags(fs)
	return c, fs.Parse(args)
}

// TestFlagsRefuseBadValues: a value a setting cannot take fails while the
// flags are parsed, naming the flag and what it takes.
func TestFlagsRefuseBadValues(t *testing.T) {
	for _, tc := range []struct{ arg, want string }{
		{"--device-plugin=maybe", "want auto, on or off"},
		{"--device-id-strategy=serial", "want uuid or index"},
		{"--mig-strategy=single", "want none or mixed"},
		{"--cdi-spec=mine", "want auto, toolkit or own"},
		{"--verify=audit", "want off, report or enforce"},
		{"--health-ignored-xids=13,abc", `"abc" is not a number`},
		{"--retry-interval=soon", "invalid argument"},
		{"--verify-interval=10", "invalid argument"},
	} {
		_, err := parseFlags(t, tc.arg)
		flag, _, _ := strings.Cut(strings.TrimPrefix(tc.arg, "--"), "=")
		if err == nil || !strings.Contains(err.Error(), "--"+flag) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error naming --%s and %q", tc.arg, err, flag, tc.want)
		}
	}
}

// TestFlagsTypedValues: durations and XID lists arrive typed, and the
// defaults validate.
func TestFlagsTypedValues(t *testing.T) {
	c, err := parseFlags(t, "--retry-interval=5s", "--verify-interval=2m", "--health-ignored-xids=48, 13")
	if err != nil {
		t.Fatal(err)
	}
	if c.RetryInterval != 5*time.Second || c.VerifyInterval != 2*time.Minute || !slices.Equal(c.IgnoredXIDs, []uint64{13, 48}) {
		t.Errorf("got retry %s, verify %s, xids %v", c.RetryInterval, c.VerifyInterval, c.IgnoredXIDs)
	}
	if c, err = parseFlags(t, "--health-ignored-xids=none"); err != nil || len(c.IgnoredXIDs) != 0 {
		t.Errorf("none: got %v, %v", c.IgnoredXIDs, err)
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Errorf("the defaults do not validate: %v", err)
	}
}
