//go:build e2e

package e2e

import (
	"bytes"
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// TestVerify runs `gpuguard verify`, the command behind the chart's helm test,
// against the suite's API server: it passes where gpuguard answers as expected,
// and fails, naming the answer, where it does not.
func TestVerify(t *testing.T) {
	kubeconfig := verifyKubeconfig(t)
	for _, tc := range []struct {
		namespace, expect string
		code              int
		out               []string // in the output
	}{
		{enforceNS, "deny", 0, []string{`.gpuguard.io" denied the request`, "[device-env]", "PASS: gpuguard denied"}},
		{warnNS, "warn", 0, []string{"HTTP 201 Created", "Warning: gpuguard device-env", "PASS: gpuguard warned"}},
		{auditNS, "admit", 0, []string{"HTTP 201 Created", "PASS: the violating pod was admitted in namespace " + auditNS + " (mode audit), with NVIDIA_VISIBLE_DEVICES made harmless"}},
		{warnNS, "deny", 1, []string{"FAIL: expected gpuguard to deny the violating pod in namespace " + warnNS, "got 201 Created (dry run), with warnings:", "gpuguard device-env"}},
	} {
		t.Run(tc.namespace+"/"+tc.expect, func(t *testing.T) {
			runVerify(t, kubeconfig, tc.namespace, tc.expect, tc.code, tc.out...)
		})
	}
}

// TestVerifyBackstopDenial: with the webhooks gone, a denial by the CEL backstop
// is gpuguard's denial too.
func TestVerifyBackstopDenial(t *testing.T) {
	kubeconfig := verifyKubeconfig(t)
	withBackstopOnly(t, func() {
		runVerify(t, kubeconfig, enforceNS, "deny", 0, "ValidatingAdmissionPolicy", "gpuguard backstop [device-env]", "PASS: gpuguard denied")
	})
}

func verifyKubeconfig(t *testing.T) string {
	t.Helper()
	kubeconfig, err := s.cp.Kubeconfig("gpuguard-verify")
	if err != nil {
		t.Fatal(err)
	}
	return kubeconfig
}

// runVerify runs the built binary's verify and checks its exit status and output.
func runVerify(t *testing.T, kubeconfig, namespace, expect string, wantCode int, wantOut ...string) {
	t.Helper()
	cmd := exec.Command(s.Binary, "verify", "--kubeconfig", kubeconfig, "--namespace", namespace, "--expect", expect)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	if code != wantCode {
		t.Errorf("verify -n %s --expect %s: exit %d, want %d:\n%s", namespace, expect, code, wantCode, out.String())
	}
	for _, want := range wantOut {
		if !strings.Contains(out.String(), want) {
			t.Errorf("verify -n %s --expect %s: output lacks %q:\n%s", namespace, expect, want, out.String())
		}
	}
}
