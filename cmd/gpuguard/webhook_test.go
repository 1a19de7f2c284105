package main

import (
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuguard/gpuguard/webhook"
	"github.com/gpuguard/gpuguard/webhook/hardening"
)

// parseWebhookFlags parses args as the webhook command's flags.
func parseWebhookFlags(t *testing.T, args ...string) (*webhookFlags, error) {
	t.Helper()
	f := &webhookFlags{cfg: webhook.DefaultConfig()}
	fs := pflag.NewFlagSet("webhook", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	f.addFlags(fs)
	return f, fs.Parse(args)
}

// TestWebhookFlagDefaults: with no flags, the command's configuration is
// webhook.DefaultConfig, which is valid.
func TestWebhookFlagDefaults(t *testing.T) {
	f, err := parseWebhookFlags(t)
	if err != nil {
		t.Fatal(err)
	}
	want := webhook.DefaultConfig()
	f.cfg.Log, want.Log = logr.Discard(), logr.Discard()
	if !reflect.DeepEqual(f.cfg, want) {
		t.Errorf("flag defaults:\n%+v\nwant DefaultConfig:\n%+v", f.cfg, want)
	}
}

// TestWebhookFlagsSetTheirSettings: typed flags fill the grouped
// configuration; repeated --gpu-node-label replaces the default list.
func TestWebhookFlagsSetTheirSettings(t *testing.T) {
	f, err := parseWebhookFlags(t, "--port=8443", "--inject-void=auto", "--role=serve",
		"--policy-configmap=ns/pol", "--cert-secret=ns/tls", "--gpu-node-label=a=b", "--gpu-node-label=c.io/d=true",
		"--shutdown-delay=5s", "--max-inflight-reviews=8")
	if err != nil {
		t.Fatal(err)
	}
	c := f.cfg
	if c.Serving.Port != 8443 || c.Hardening.InjectVoid != webhook.InjectAuto || c.Role != webhook.RoleServe ||
		c.Policy.ConfigMap != (types.NamespacedName{Namespace: "ns", Name: "pol"}) ||
		c.Certificates.Secret != (types.NamespacedName{Namespace: "ns", Name: "tls"}) ||
		c.Serving.ShutdownDelay.Seconds() != 5 || c.Limits.MaxReviews != 8 ||
		!reflect.DeepEqual(c.Hardening.GPUNodeLabels, []hardening.Label{{Key: "a", Value: "b"}, {Key: "c.io/d", Value: "true"}}) {
		t.Errorf("parsed: %+v", c)
	}
}

// TestWebhookFlagsRefuseBadValues: a value not of its flag's type fails as
// the flags are parsed, naming the flag.
func TestWebhookFlagsRefuseBadValues(t *testing.T) {
	for _, tc := range []struct{ arg, want string }{
		{"--inject-void=maybe", `invalid argument "maybe" for "--inject-void" flag: want one of always, auto, never`},
		{"--role=writer", `"--role" flag: want one of all, serve, control`},
		{"--port=0", `"--port" flag: want a port, 1-65535`},
		{"--port=http", `"--port" flag`},
		{"--api-read-timeout=0s", `"--api-read-timeout" flag: want at least 1ms`},
		{"--overload-wait=soon", `"--overload-wait" flag: want a duration`},
		{"--policy-configmap=a/b/c", `"--policy-configmap" flag: want NAMESPACE/NAME`},
		{"--cert-secret=Bad_NS/x", `"--cert-secret" flag: namespace "Bad_NS"`},
		{"--gpu-node-label=novalue", `"--gpu-node-label" flag: node label "novalue": want KEY=VALUE`},
		{"--gpu-node-label=a=b c", `"--gpu-node-label" flag: label value "b c"`},
		{"--max-inflight-review-bytes=-1", `"--max-inflight-review-bytes" flag: want an integer of at least 1`},
	} {
		_, err := parseWebhookFlags(t, tc.arg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.arg, err, tc.want)
		}
	}
}

// TestWebhookSettingErrorsNameTheirFlag: Validate names settings; the
// command adds the flag that sets each, and every setting Validate can
// refuse has one.
func TestWebhookSettingErrorsNameTheirFlag(t *testing.T) {
	f, err := parseWebhookFlags(t, "--policy-file", "--audit-reports", "--write-cert-dir", "--cel-backstop-owner=x",
		"--gpu-dra-driver=GPU_driver")
	if err != nil {
		t.Fatal(err)
	}
	got := describeSettings(f.cfg.Validate())
	for _, want := range []string{
		"--audit-reports (audit.reports): ",
		"--write-cert-dir (certificates.writeDir): ",
		"--cel-backstop-owner (backstop.owner): ",
		`--gpu-dra-driver (hardening.gpuDRADrivers): "GPU_driver" is not a DRA driver name`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("lacks %q:\n%s", want, got)
		}
	}
	cmd := newWebhookCommand()
	for setting, flag := range settingFlags {
		if cmd.Flags().Lookup(flag) == nil {
			t.Errorf("%s: no flag --%s", setting, flag)
		}
	}
}
