package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpuguard/gpuguard/internal/kubeconfig"
	"github.com/gpuguard/gpuguard/internal/warnings"
	"github.com/gpuguard/gpuguard/policy"
)

// What verify may expect of the API server's answer.
const (
	expectDeny  = "deny"
	expectWarn  = "warn"
	expectAdmit = "admit"
	expectStrip = "strip"
)

var expectations = []string{expectDeny, expectWarn, expectAdmit, expectStrip}

type verifyOptions struct {
	namespace string
	expect    string
	kube      kubeconfig.Flags
	timeout   time.Duration
	// wait asks again until the answer is the expected one or it passes:
	// a policy change takes the webhook a few seconds to apply.
	wait time.Duration
}

func newVerifyCommand() *cobra.Command {
	o := &verifyOptions{}
	cmd := &cobra.Command{
		Use:   "verify --namespace NS [--expect deny|warn|admit|strip] [--kubeconfig PATH] [--timeout 30s]",
		Short: "Check that a cluster's gpuguard judges a violating pod as expected (server-side dry run)",
		Long: `verify asks the API server to create, as a dry run (nothing is stored or
scheduled), a pod in --namespace that breaks only gpuguard's policy: no GPU limit,
yet NVIDIA_VISIBLE_DEVICES=all. The pod otherwise meets Pod Security "restricted".

--expect deny passes when gpuguard (its webhook or its CEL backstop) denies the
pod; warn when the pod is admitted with a gpuguard warning; admit when it is
admitted at all (audit mode: the API server's audit log has gpuguard's
annotations); strip when it is admitted with the variable removed or made
harmless (enforce mode with action: strip).

The cluster comes from --kubeconfig, else $KUBECONFIG or ~/.kube/config, else the
in-cluster service account. It needs permission to create pods in --namespace.

It prints the API server's answer and one PASS or FAIL line. Exit status: 0 when
the answer is the expected one, 1 when it is not or no answer came, 2 for usage
or configuration errors.`,
		Example: `  gpuguard verify --namespace ml-team
  gpuguard verify --namespace ml-team --expect warn --kubeconfig ~/.kube/staging
  gpuguard verify --namespace ml-team --wait 1m   # after a policy change, until it is in force`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd.Context(), cmd.OutOrStdout())
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&o.namespace, "namespace", "n", "", "a namespace gpuguard guards, where the dry-run pod is created (required)")
	fl.StringVar(&o.expect, "expect", expectDeny, "what gpuguard should do with the pod: "+strings.Join(expectations, ", "))
	o.kube.AddFlags(fl)
	fl.DurationVar(&o.timeout, "timeout", 30*time.Second, "how long to wait for the API server's answer")
	fl.DurationVar(&o.wait, "wait", 0, "ask again, every second, until the answer is the expected one or this long has passed (after a policy change, which the webhook applies within seconds); 0 asks once")
	_ = cmd.MarkFlagRequired("namespace")
	return cmd
}

func (o *verifyOptions) run(ctx context.Context, stdout io.Writer) error {
	if !slices.Contains(expectations, o.expect) {
		return &exitError{exitUsage, fmt.Sprintf("--expect %q: use %s", o.expect, strings.Join(expectations, ", "))}
	}
	if o.namespace == "" {
		return &exitError{exitUsage, "--namespace: name a namespace gpuguard guards"}
	}
	if o.timeout <= 0 {
		return &exitError{exitUsage, fmt.Sprintf("--timeout %v: must be above zero", o.timeout)}
	}
	if o.wait < 0 {
		return &exitError{exitUsage, fmt.Sprintf("--wait %v: must be zero (ask once) or more", o.wait)}
	}
	cfg, err := o.restConfig()
	if err != nil {
		return &exitError{exitUsage, err.Error()}
	}
	if ctx == nil {
		ctx = context.Background()
	}
	deadline := time.Now().Add(o.wait)
	for {
		a, err := o.ask(ctx, cfg)
		if err != nil {
			return err
		}
		if _, ok := o.judge(a); ok || a.transport != nil || !time.Now().Before(deadline) {
			return o.report(stdout, cfg.Host, a)
		}
		select {
		case <-ctx.Done():
			return o.report(stdout, cfg.Host, a)
		case <-time.After(time.Second):
		}
	}
}

// ask sends the dry-run create once and returns the API server's answer.
func (o *verifyOptions) ask(ctx context.Context, base *rest.Config) (answer, error) {
	cfg := rest.CopyConfig(base)
	collected := &warnings.Collector{}
	cfg.WarningHandler = collected
	cfg.Timeout = o.timeout
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return answer{}, &exitError{exitUsage, err.Error()}
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	pod, err := client.CoreV1().Pods(o.namespace).Create(ctx, violatingPod(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	a := answerOf(err, collected.All())
	if a.created {
		a.allGPUs = grantsAllGPUs(pod)
	}
	return a, nil
}

// report prints the answer and the PASS or FAIL line; the FAIL line repeats what
// came back, since a helm test log may show only its last lines.
func (o *verifyOptions) report(w io.Writer, host string, a answer) error {
	expected := fmt.Sprintf("expected gpuguard to %s the violating pod in namespace %s", o.expect, o.namespace)
	if a.transport != nil {
		fmt.Fprintf(w, "FAIL: %s; %s\n", expected, noAnswer(host, a.transport, o.timeout))
		return &exitError{code: exitFailed}
	}
	a.print(w)
	if verdict, ok := o.judge(a); ok {
		fmt.Fprintln(w, "PASS:", verdict)
		return nil
	}
	fmt.Fprintf(w, "FAIL: %s; got %s\n", expected, a.summary())
	return &exitError{code: exitFailed}
}

// restConfig loads the kubeconfig the way kubectl does and falls back to the
// in-cluster service account, so that the same command runs from a laptop and
// as the chart's test pod.
func (o *verifyOptions) restConfig() (*rest.Config, error) { return o.kube.Load() }

// violatingPod breaks gpuguard's policy and nothing else: no GPU limit, yet every
// GPU of the node through NVIDIA_VISIBLE_DEVICES=all. It meets Pod Security
// "restricted", so that only gpuguard has a reason to refuse it; the image is
// never pulled, since the pod is only a dry run.
func violatingPod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "gpuguard-verify-"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   new(true),
				RunAsUser:      new(int64(65532)),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:  "miner",
				Image: "busybox",
				Env:   []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: new(false),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
}

// answer is what the API server said to the dry-run create.
type answer struct {
	created bool
	// allGPUs: the pod as admitted still has NVIDIA_VISIBLE_DEVICES=all.
	allGPUs   bool
	status    metav1.Status // when not created and the API server answered
	warnings  []string
	transport error // no answer at all
}

func answerOf(err error, warnings []string) answer {
	a := answer{warnings: warnings}
	var st apierrors.APIStatus
	switch {
	case err == nil:
		a.created = true
	case errors.As(err, &st):
		a.status = st.Status()
	default:
		a.transport = err
	}
	return a
}

// print writes the answer in full, as the API server gave it.
func (a answer) print(w io.Writer) {
	if a.created {
		fmt.Fprintln(w, "HTTP 201 Created (dry run: nothing was stored)")
	} else {
		fmt.Fprintf(w, "HTTP %d %s: %s\n", a.status.Code, a.status.Reason, a.status.Message)
	}
	for _, warning := range a.warnings {
		fmt.Fprintln(w, "Warning:", warning)
	}
}

// summary is the answer on one line, for the FAIL line.
func (a answer) summary() string {
	var s string
	if a.created {
		s = "201 Created (dry run)"
	} else {
		msg, _, _ := strings.Cut(a.status.Message, "\n")
		s = fmt.Sprintf("%d %s: %s", a.status.Code, a.status.Reason, msg)
	}
	if a.created && a.allGPUs {
		s += " still with NVIDIA_VISIBLE_DEVICES=all"
	}
	if len(a.warnings) == 0 {
		return s + ", with no warnings"
	}
	return fmt.Sprintf("%s, with warnings: %s", s, strings.Join(a.warnings, "; "))
}

// judge says whether the answer is the expected one, and what passed.
func (o *verifyOptions) judge(a answer) (string, bool) {
	switch o.expect {
	case expectDeny:
		reason := a.status.Reason
		if !a.created && (reason == metav1.StatusReasonForbidden || reason == metav1.StatusReasonInvalid) && deniedByGPUGuard(a.status.Message) {
			return "gpuguard denied the violating pod in namespace " + o.namespace, true
		}
	case expectWarn:
		if a.created && slices.ContainsFunc(a.warnings, mentionsGPUGuard) {
			return "gpuguard warned about the violating pod in namespace " + o.namespace + " (mode warn)", true
		}
	case expectStrip:
		if a.created && !a.allGPUs {
			return "gpuguard stripped NVIDIA_VISIBLE_DEVICES=all from the violating pod in namespace " + o.namespace + " (action strip)", true
		}
	case expectAdmit:
		// An admission in audit mode looks like no gpuguard at all, unless its
		// mutating webhook left its mark: say which it was.
		if a.created && !a.allGPUs {
			return "the violating pod was admitted in namespace " + o.namespace + " (mode audit), with NVIDIA_VISIBLE_DEVICES made harmless by gpuguard's mutating webhook; the API server's audit log has gpuguard's annotations", true
		}
		if a.created {
			return "the violating pod was admitted unchanged in namespace " + o.namespace + "; nothing in the answer shows gpuguard saw it: look for its annotations in the API server's audit log", true
		}
	}
	return "", false
}

// grantsAllGPUs reports whether a container of the admitted pod still asks
// the NVIDIA runtime for every GPU: of several entries of the variable, the
// last one is what the container gets.
func grantsAllGPUs(pod *corev1.Pod) bool {
	if pod == nil {
		return false
	}
	for i := range pod.Spec.Containers {
		if v, ok := policy.EffectiveEnv(&pod.Spec.Containers[i], "NVIDIA_VISIBLE_DEVICES"); ok && v.Value == "all" {
			return true
		}
	}
	return false
}

// gpuguardWebhook matches the API server's message for a denial by one of
// gpuguard's admission webhooks, whose names all end in gpuguard.io.
var gpuguardWebhook = regexp.MustCompile(`admission webhook "[^"]*\.gpuguard\.io" denied the request`)

// deniedByGPUGuard tells a denial by gpuguard, from its webhook or its CEL
// backstop ("gpuguard backstop [rule]: ..."), from a denial by anything else
// (Pod Security, RBAC, another policy engine), which must not pass.
func deniedByGPUGuard(msg string) bool {
	return gpuguardWebhook.MatchString(msg) || strings.Contains(msg, "gpuguard backstop [")
}

func mentionsGPUGuard(warning string) bool {
	return strings.Contains(strings.ToLower(warning), "gpuguard")
}

// noAnswer says why no answer came: a timeout, an error reaching the server, or
// an answer that is neither the pod nor a Status.
func noAnswer(host string, err error, timeout time.Duration) string {
	var ne net.Error
	var ue *url.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()):
		return fmt.Sprintf("the API server at %s did not answer within %v: %v", host, timeout, err)
	case errors.As(err, &ue):
		return fmt.Sprintf("could not reach the API server at %s: %v", host, err)
	}
	return fmt.Sprintf("no usable answer from the API server at %s: %v", host, err)
}
