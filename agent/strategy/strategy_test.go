package strategy

import (
	"strings"
	"testing"

	"github.com/gpuguard/gpuguard/agent/nodereport"
)

func toolkit(t *testing.T, scenario string) (*nodereport.ToolkitConfig, *nodereport.ContainerdConfig) {
	t.Helper()
	l := nodereport.Locator{HostRoot: "../nodereport/testdata/" + scenario, Getenv: func(string) string { return "" }}
	tk, err := l.LoadToolkitConfig()
	if err != nil || tk == nil {
		t.Fatalf("toolkit config of %s: %v", scenario, err)
	}
	c, err := l.LoadContainerdConfig()
	if err != nil || c == nil {
		t.Fatalf("containerd config of %s: %v", scenario, err)
	}
	return tk, c
}

func TestParse(t *testing.T) {
	good := map[string]string{
		"envvar":                          "envvar",
		"volume-mounts":                   "volume-mounts",
		"cdi-cri,cdi-annotations":         "cdi-annotations,cdi-cri",
		" envvar , cdi-cri ":              "envvar,cdi-cri",
		"cdi-annotations,cdi-annotations": "cdi-annotations",
	}
	for in, want := range good {
		l, err := Parse(in)
		if err != nil || l.String() != want {
			t.Errorf("Parse(%q) = %q, %v; want %q", in, l, err, want)
		}
	}
	if l, err := Parse("auto"); l != nil || err != nil {
		t.Errorf("auto: %v %v", l, err)
	}
	for _, bad := range []string{"env", "envvar,volume-mounts", "auto,envvar", "cdi", ",", "envvar,"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q): no error", bad)
		}
	}
}

func TestAutoChoices(t *testing.T) {
	cases := []struct {
		scenario string
		want     string
		warn     string
	}{
		{"hardened", "volume-mounts", ""},
		{"default", "envvar", "NODE NOT HARDENED"},
		{"operator-cdi", "cdi-annotations,cdi-cri", ""},
	}
	for _, tc := range cases {
		tk, c := toolkit(t, tc.scenario)
		ch, err := Resolve("auto", tk, c)
		if err != nil {
			t.Fatalf("%s: %v", tc.scenario, err)
		}
		if ch.List.String() != tc.want {
			t.Errorf("%s: auto chose %s, want %s", tc.scenario, ch.List, tc.want)
		}
		if (tc.warn == "") != (ch.Warning == "") || !strings.Contains(ch.Warning, tc.warn) {
			t.Errorf("%s: warning %q, want %q", tc.scenario, ch.Warning, tc.warn)
		}
	}
	ch, err := Resolve("", nil, nil)
	if err != nil || ch.List.String() != "envvar" || !strings.Contains(ch.Warning, "NODE NOT HARDENED") {
		t.Errorf("no toolkit config: %+v %v", ch, err)
	}
}

// A toolkit that rejects the env var and volume mounts outside CDI mode
// leaves auto only containerd's own CDI support; without it auto refuses
// rather than pick a channel GPU pods would get nothing through.
func TestAutoWhenTheToolkitHonoursNoChannel(t *testing.T) {
	tk, ctrd := toolkit(t, "inconsistent")
	if _, err := Resolve("auto", tk, ctrd); err == nil || !strings.Contains(err.Error(), nodereport.KeyAcceptVolumeMounts+" = true") {
		t.Fatalf("enable_cdi = false: got %v, want a refusal naming the setting", err)
	}
	on := true
	ctrd.CDIEnabled = &on
	ch, err := Resolve("auto", tk, ctrd)
	if err != nil || ch.List.String() != "cdi-annotations,cdi-cri" || ch.Warning != "" {
		t.Fatalf("enable_cdi = true: %+v %v, want CDI without warning", ch, err)
	}
	ctrd.CDIEnabled = nil
	if _, err := Resolve("auto", tk, ctrd); err == nil {
		t.Fatal("unknown containerd CDI support: accepted")
	}
}

// In CDI mode with containerd's CDI off, only the NVIDIA runtime can read
// CDI annotations, and only those its containerd runtime passes through.
func TestAutoCDIModeNeedsAnnotationPassthrough(t *testing.T) {
	tk, ctrd := toolkit(t, "operator-cdi")
	off := false
	ctrd.CDIEnabled = &off
	ch, err := Resolve("auto", tk, ctrd)
	if err != nil || ch.List.String() != "cdi-annotations" {
		t.Fatalf("with container_annotations: %+v %v", ch, err)
	}
	r := ctrd.Runtimes["nvidia-cdi"]
	r.ContainerAnnotations = nil
	ctrd.Runtimes["nvidia-cdi"] = r
	if _, err := Resolve("auto", tk, ctrd); err == nil || !strings.Contains(err.Error(), "enable_cdi = true") {
		t.Fatalf("without container_annotations: got %v, want a refusal", err)
	}
}

func TestRefusals(t *testing.T) {
	cases := []struct {
		scenario, flag, mention string
	}{
		{"default", "volume-mounts", nodereport.KeyAcceptVolumeMounts + " = true"},
		{"inconsistent", "volume-mounts", nodereport.KeyAcceptVolumeMounts},
		{"hardened", "envvar", nodereport.KeyAcceptEnvvarUnprivileged},
		{"inconsistent", "cdi-cri", "enable_cdi = true"},
		{"inconsistent", "cdi-annotations", "enable_cdi = true"},
	}
	for _, tc := range cases {
		tk, c := toolkit(t, tc.scenario)
		_, err := Resolve(tc.flag, tk, c)
		if err == nil {
			t.Errorf("%s with %s: accepted", tc.scenario, tc.flag)
			continue
		}
		if !strings.Contains(err.Error(), tc.mention) {
			t.Errorf("%s with %s: %q does not mention %q", tc.scenario, tc.flag, err, tc.mention)
		}
	}
}

func TestExplicitAccepted(t *testing.T) {
	cases := []struct {
		scenario, flag string
		warn           bool
	}{
		{"hardened", "volume-mounts", false},
		{"hardened", "cdi-annotations,cdi-cri", false},
		{"default", "envvar", true},
		{"default", "cdi-cri", true},
		{"operator-cdi", "cdi-cri", false},
	}
	for _, tc := range cases {
		tk, c := toolkit(t, tc.scenario)
		ch, err := Resolve(tc.flag, tk, c)
		if err != nil {
			t.Errorf("%s with %s: %v", tc.scenario, tc.flag, err)
			continue
		}
		if (ch.Warning != "") != tc.warn {
			t.Errorf("%s with %s: warning %q", tc.scenario, tc.flag, ch.Warning)
		}
	}
	ch, err := Resolve("volume-mounts", nil, nil)
	if err != nil || ch.Warning == "" {
		t.Errorf("unverifiable explicit strategy must warn: %+v %v", ch, err)
	}
}
