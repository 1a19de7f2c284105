// Package charts tests the gpuguard Helm chart with the Helm SDK: lint, golden
// renderings of the main value combinations, strict decoding of every rendered
// object, and the security properties the chart promises.
package charts

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"

	gpuguardcel "github.com/gpuguard/gpuguard/cel"
	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/internal/manifest"
	"github.com/gpuguard/gpuguard/internal/wellknown"
	"github.com/gpuguard/gpuguard/policy"
	"github.com/gpuguard/gpuguard/tools/chartrender"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

const (
	chartDir    = "gpuguard"
	releaseName = "gpuguard"
	namespace   = "gpuguard-system"
	kubeVersion = chartrender.KubeVersion
	fullname    = "gpuguard"
)

// renderCase is one value combination with a golden file.
type renderCase struct {
	name   string
	values string
}

var cases = []renderCase{
	{"default", ``},
	{"cert-manager", `
certificates:
  mode: cert-manager
`},
	{"cert-manager-issuer", `
certificates:
  mode: cert-manager
  certManager:
    issuerRef: {name: corp-ca, kind: ClusterIssuer, group: cert-manager.io}
`},
	{"existing-secret", `
certificates:
  mode: secret
  existingSecret:
    name: corp-webhook-tls
    caBundle: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==
`},
	{"agent-off", `
agent:
  enabled: false
`},
	{"node-enforcer", `
agent:
  enforce: true
admission:
  injectVoid: auto
`},
	{"gpu-operator", `
policy:
  presets:
    gpuOperator:
      enabled: true
`},
	{"custom-policy", `
policy:
  mode: warn
  spec:
    action: strip
    env:
      unprefixedEnvFromOnGPU: warn
    exemptions:
      serviceAccounts:
        - {namespace: ci, name: gpu-smoke-test}
`},
	{"custom-document", `
policy:
  document: |
    apiVersion: gpuguard.io/v1alpha1
    kind: GPUGuardPolicy
    metadata:
      name: strict
    spec:
      mode: enforce
      advisories:
        privileged: deny
`},
	{"system-namespaces", `
admission:
  systemNamespaces: [kube-public, longhorn-system, rook-ceph, calico-system]
`},
	{"observability", `
metrics:
  serviceMonitor:
    enabled: true
    labels: {release: prometheus}
  prometheusRule:
    enabled: true
    labels: {release: prometheus}
  grafanaDashboard:
    enabled: true
networkPolicy:
  enabled: true
  metricsFrom:
    - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}
agent:
  publishNodeLabels: true
webhook:
  image: {digest: "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}
`},
	// The platform profiles (docs/platforms.md); eks with a custom CNI.
	{"platform-eks", `
platform: eks
webhook:
  hostNetwork: true
`},
	{"platform-gke", `
platform: gke
`},
	{"platform-aks", `
platform: aks
`},
	{"platform-openshift", `
platform: openshift
`},
	{"platform-k3s", `
platform: k3s
`},
	{"platform-rke2", `
platform: rke2
`},
}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("loading the chart: %v", err)
	}
	return c
}

func parseValues(t *testing.T, s string) map[string]any {
	t.Helper()
	v, err := chartutil.ReadValues([]byte(s))
	if err != nil {
		t.Fatalf("values: %v", err)
	}
	return v
}

// clusterAPIs are the optional APIs of the cluster the goldens are rendered for: a
// Kubernetes 1.37 cluster, serving both admission policy APIs as v1, with
// cert-manager and the Prometheus Operator.
var clusterAPIs = []string{"cert-manager.io/v1", "monitoring.coreos.com/v1",
	"admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"}

// rendered is one release rendered client-side, as helm template does, with the
// golden text of it: manifests, hooks and NOTES.txt.
type rendered struct {
	*chartrender.Release
	golden string
}

func render(t *testing.T, c *chart.Chart, values map[string]any) (*rendered, error) {
	t.Helper()
	rel, err := chartrender.Render(c, releaseName, namespace, values, clusterAPIs...)
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	b.WriteString(rel.Raw)
	for _, h := range rel.Hooks {
		fmt.Fprintf(&b, "\n---\n# Hook: %s\n%s\n", h.Path, h.Manifest)
	}
	fmt.Fprintf(&b, "\n---\n# NOTES.txt\n%s", commentOut(rel.Notes))
	return &rendered{Release: rel, golden: foldPolicies(b.String())}, nil
}

func commentOut(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		b.WriteString(strings.TrimRight("# "+l, " ") + "\n")
	}
	return b.String()
}

func renderCaseValues(t *testing.T, c *chart.Chart, rc renderCase) *rendered {
	t.Helper()
	r, err := render(t, c, parseValues(t, rc.values))
	if err != nil {
		t.Fatalf("rendering %s: %v", rc.name, err)
	}
	return r
}

// TestLint runs helm lint on the chart with the defaults and with every case.
func TestLint(t *testing.T) {
	kv, err := chartutil.ParseKubeVersion(kubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	for _, rc := range cases {
		if strings.HasPrefix(rc.name, "cert-manager") {
			continue // lint renders without cert-manager's API; rendering covers it
		}
		t.Run(rc.name, func(t *testing.T) {
			linter := lint.AllWithKubeVersion(chartDir, parseValues(t, rc.values), namespace, kv)
			for _, m := range linter.Messages {
				if m.Severity >= support.WarningSev {
					t.Errorf("helm lint: %s", m)
				}
			}
		})
	}
}

// TestGolden compares each rendering with testdata/<case>.yaml (-update rewrites them).
func TestGolden(t *testing.T) {
	c := loadChart(t)
	for _, rc := range cases {
		t.Run(rc.name, func(t *testing.T) {
			r := renderCaseValues(t, c, rc)
			path := filepath.Join("testdata", rc.name+".yaml")
			if *update {
				if err := os.WriteFile(path, []byte(r.golden), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./charts -update)", err)
			}
			if string(want) != r.golden {
				t.Errorf("rendering differs from %s; if intended, run go test ./charts -update and review the diff\n%s", path, firstDiff(string(want), r.golden))
			}
		})
	}
}

func firstDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < len(w) || i < len(g); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			return fmt.Sprintf("line %d:\n  want %q\n  got  %q", i+1, wl, gl)
		}
	}
	return ""
}

// decoder decodes built-in kinds strictly: unknown and duplicate fields fail.
var decoder = serializer.NewCodecFactory(chartScheme(), serializer.EnableStrict).UniversalDeserializer()

// chartScheme knows the kinds the chart renders: Kubernetes' own and the
// OpenReports CRDs.
func chartScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(apiextensionsv1.AddToScheme(s))
	return s
}

// Kinds of other APIs the chart renders, decoded strictly into the subset of
// their schema the chart uses (cert-manager.io/v1, monitoring.coreos.com/v1).
type objectMeta struct {
	Name        string            `json:"name"`
	Namespace   string            `json:"namespace"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type issuerRef struct {
	Name  string `json:"name"`
	Kind  string `json:"kind,omitempty"`
	Group string `json:"group,omitempty"`
}

type certificate struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   objectMeta `json:"metadata"`
	Spec       struct {
		IsCA        bool     `json:"isCA,omitempty"`
		CommonName  string   `json:"commonName,omitempty"`
		SecretName  string   `json:"secretName"`
		Duration    string   `json:"duration,omitempty"`
		RenewBefore string   `json:"renewBefore,omitempty"`
		DNSNames    []string `json:"dnsNames,omitempty"`
		Usages      []string `json:"usages,omitempty"`
		PrivateKey  *struct {
			Algorithm      string `json:"algorithm,omitempty"`
			Size           int    `json:"size,omitempty"`
			RotationPolicy string `json:"rotationPolicy,omitempty"`
		} `json:"privateKey,omitempty"`
		IssuerRef issuerRef `json:"issuerRef"`
	} `json:"spec"`
}

type issuer struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   objectMeta `json:"metadata"`
	Spec       struct {
		SelfSigned *struct{} `json:"selfSigned,omitempty"`
		CA         *struct {
			SecretName string `json:"secretName"`
		} `json:"ca,omitempty"`
	} `json:"spec"`
}

type serviceMonitor struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   objectMeta `json:"metadata"`
	Spec       struct {
		Selector          struct{ MatchLabels map[string]string } `json:"selector"`
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		Endpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path"`
			Interval string `json:"interval"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// decodeAll decodes every object of a rendering strictly.
func decodeAll(t *testing.T, docs []string) []runtime.Object {
	t.Helper()
	var objs []runtime.Object
	for _, doc := range docs {
		var head struct{ APIVersion, Kind string }
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatalf("not YAML: %v\n%s", err, doc)
		}
		if head.Kind == "" {
			continue
		}
		var err error
		switch head.APIVersion {
		case "cert-manager.io/v1":
			switch head.Kind {
			case "Certificate":
				err = yaml.UnmarshalStrict([]byte(doc), &certificate{})
			case "Issuer":
				err = yaml.UnmarshalStrict([]byte(doc), &issuer{})
			default:
				err = fmt.Errorf("unexpected kind")
			}
		case "monitoring.coreos.com/v1":
			switch head.Kind {
			case "ServiceMonitor":
				err = yaml.UnmarshalStrict([]byte(doc), &serviceMonitor{})
			case "PrometheusRule":
				// The Prometheus Operator's own types: its CRD is generated from them.
				rule := &monitoringv1.PrometheusRule{}
				if err = yaml.UnmarshalStrict([]byte(doc), rule); err == nil {
					objs = append(objs, rule)
				}
			default:
				err = fmt.Errorf("unexpected kind")
			}
		default:
			var obj runtime.Object
			obj, _, err = decoder.Decode([]byte(doc), nil, nil)
			if err == nil {
				objs = append(objs, obj)
			}
		}
		if err != nil {
			t.Errorf("%s %s does not decode strictly: %v\n%s", head.APIVersion, head.Kind, err, doc)
		}
	}
	return objs
}

// docs are the documents of a rendering, with the webhook configurations
// the webhook registers itself (held in a ConfigMap of the release).
func docs(r *rendered, withHooks bool) []string {
	registered, err := r.WebhookConfigurations()
	if err != nil {
		panic(err)
	}
	return append(r.Documents(withHooks), registered...)
}

// named is the object of type T and name, which must be there.
func named[T interface {
	runtime.Object
	GetName() string
}](t *testing.T, objs []runtime.Object, name string) T {
	t.Helper()
	for _, o := range findAll[T](objs) {
		if o.GetName() == name {
			return o
		}
	}
	var zero T
	t.Fatalf("no %T named %s", zero, name)
	return zero
}

func findAll[T runtime.Object](objs []runtime.Object) []T {
	var out []T
	for _, o := range objs {
		if v, ok := o.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

func one[T runtime.Object](t *testing.T, objs []runtime.Object) T {
	t.Helper()
	all := findAll[T](objs)
	if len(all) != 1 {
		var zero T
		t.Fatalf("want one %T, got %d", zero, len(all))
	}
	return all[0]
}

// TestStrictDecode decodes every object of every case, hooks included.
func TestStrictDecode(t *testing.T) {
	c := loadChart(t)
	for _, rc := range cases {
		t.Run(rc.name, func(t *testing.T) {
			decodeAll(t, docs(renderCaseValues(t, c, rc), true))
		})
	}
}

// TestWebhookConfigurations checks failure policies, selectors and the rest of
// what the issue specifies, in every case.
func TestWebhookConfigurations(t *testing.T) {
	c := loadChart(t)
	for _, rc := range cases {
		t.Run(rc.name, func(t *testing.T) {
			r := renderCaseValues(t, c, rc)
			objs := decodeAll(t, docs(r, false))
			wantExcluded := []string{"kube-system", "kube-node-lease", namespace}
			sys := []string{"calico-system", "tigera-operator", "kube-flannel", "cert-manager"}
			if rc.name == "system-namespaces" {
				sys = []string{"kube-public", "longhorn-system", "rook-ceph", "calico-system"}
			}
			wantExcluded = append(wantExcluded, sys...)

			mwc := one[*admissionv1.MutatingWebhookConfiguration](t, objs)
			vwc := one[*admissionv1.ValidatingWebhookConfiguration](t, objs)
			if len(mwc.Webhooks) != 1 || len(vwc.Webhooks) != 2 {
				t.Fatalf("want 1 mutating and 2 validating webhooks, got %d and %d", len(mwc.Webhooks), len(vwc.Webhooks))
			}
			m := mwc.Webhooks[0]
			checkCommon(t, m.Name, m.ClientConfig, m.SideEffects, m.AdmissionReviewVersions, m.NamespaceSelector, m.ObjectSelector, wantExcluded, "/mutate", rc.name)
			checkFailure(t, m.Name, m.FailurePolicy, admissionv1.Ignore)
			if m.ReinvocationPolicy == nil || *m.ReinvocationPolicy != admissionv1.IfNeededReinvocationPolicy {
				t.Errorf("%s: reinvocationPolicy must be IfNeeded", m.Name)
			}
			checkRules(t, m.Name, m.Rules, map[string][]string{"pods": {"CREATE"}, "pods/ephemeralcontainers": {"UPDATE"}})
			checkTimeout(t, m.Name, m.TimeoutSeconds, 5)

			pods, ctrls := vwc.Webhooks[0], vwc.Webhooks[1]
			for _, w := range vwc.Webhooks {
				checkCommon(t, w.Name, w.ClientConfig, w.SideEffects, w.AdmissionReviewVersions, w.NamespaceSelector, w.ObjectSelector, wantExcluded, "/validate", rc.name)
			}
			// Fail closed only in enforce mode; the chart's default is warn.
			wantPods := admissionv1.Ignore
			if renderedMode(t, r) == config.ModeEnforce {
				wantPods = admissionv1.Fail
			}
			checkFailure(t, pods.Name, pods.FailurePolicy, wantPods)
			checkFailure(t, ctrls.Name, ctrls.FailurePolicy, admissionv1.Ignore)
			checkRules(t, pods.Name, pods.Rules, map[string][]string{"pods": {"CREATE", "UPDATE"}, "pods/ephemeralcontainers": {"UPDATE"},
				"pods/status": {"UPDATE"}, "pods/binding": {"CREATE"}, "bindings": {"CREATE"}})
			// Status reports that leave annotations alone never reach the webhook;
			// the filter is the CEL backstop's, so the two cannot drift apart.
			if len(pods.MatchConditions) != 2 || pods.MatchConditions[0].Expression != gpuguardcel.AnnotationsChanged ||
				!strings.Contains(pods.MatchConditions[1].Expression, `request.kind.kind != "Binding"`) {
				t.Errorf("%s: match conditions %+v, want the status filter (cel.AnnotationsChanged) and the binding filter", pods.Name, pods.MatchConditions)
			}
			checkRules(t, ctrls.Name, ctrls.Rules, map[string][]string{
				"deployments": {"CREATE", "UPDATE"}, "replicasets": {"CREATE", "UPDATE"}, "statefulsets": {"CREATE", "UPDATE"},
				"daemonsets": {"CREATE", "UPDATE"}, "jobs": {"CREATE", "UPDATE"}, "cronjobs": {"CREATE", "UPDATE"},
				"replicationcontrollers": {"CREATE", "UPDATE"}, "podtemplates": {"CREATE", "UPDATE"},
			})
			checkTimeout(t, pods.Name, pods.TimeoutSeconds, 5)
			checkTimeout(t, ctrls.Name, ctrls.TimeoutSeconds, 3)

			// helm uninstall deletes them: regular resources, never kept, never hooks.
			for _, meta := range []map[string]string{mwc.Annotations, vwc.Annotations} {
				if meta["helm.sh/resource-policy"] != "" || meta["helm.sh/hook"] != "" {
					t.Errorf("webhook configurations must be plain release resources, got annotations %v", meta)
				}
			}
			inject := "cert-manager.io/inject-ca-from"
			if strings.HasPrefix(rc.name, "cert-manager") {
				if mwc.Annotations[inject] != namespace+"/gpuguard-webhook" || vwc.Annotations[inject] != namespace+"/gpuguard-webhook" {
					t.Errorf("cert-manager mode: want %s on both configurations", inject)
				}
			} else if mwc.Annotations[inject] != "" || vwc.Annotations[inject] != "" {
				t.Errorf("%s outside cert-manager mode", inject)
			}
		})
	}
}

func checkCommon(t *testing.T, name string, cc admissionv1.WebhookClientConfig, se *admissionv1.SideEffectClass, arv []string,
	ns, obj *metav1.LabelSelector, excluded []string, path, caseName string) {
	t.Helper()
	if se == nil || *se != admissionv1.SideEffectClassNone {
		t.Errorf("%s: sideEffects must be None", name)
	}
	if !slices.Equal(arv, []string{"v1"}) {
		t.Errorf("%s: admissionReviewVersions = %v, want [v1]", name, arv)
	}
	if obj != nil {
		t.Errorf("%s: objectSelector must not be set (users control pod labels)", name)
	}
	if ns == nil || len(ns.MatchLabels) != 0 || len(ns.MatchExpressions) != 1 {
		t.Fatalf("%s: namespaceSelector must be one expression, got %+v", name, ns)
	}
	e := ns.MatchExpressions[0]
	if e.Key != "kubernetes.io/metadata.name" || e.Operator != "NotIn" {
		t.Errorf("%s: namespaceSelector must be NotIn on kubernetes.io/metadata.name, got %+v", name, e)
	}
	if got, want := sorted(e.Values), sorted(excluded); !slices.Equal(got, want) {
		t.Errorf("%s: excluded namespaces = %v, want %v", name, got, want)
	}
	if cc.Service == nil || cc.Service.Name != "gpuguard-webhook" || cc.Service.Namespace != namespace || cc.Service.Path == nil || *cc.Service.Path != path ||
		cc.Service.Port == nil || *cc.Service.Port != 443 || cc.URL != nil {
		t.Errorf("%s: clientConfig = %+v", name, cc)
	}
	if (caseName == "existing-secret") != (len(cc.CABundle) > 0) {
		t.Errorf("%s: caBundle is set only with an existing Secret (got %d bytes)", name, len(cc.CABundle))
	}
}

func checkFailure(t *testing.T, name string, got *admissionv1.FailurePolicyType, want admissionv1.FailurePolicyType) {
	t.Helper()
	if got == nil || *got != want {
		t.Errorf("%s: failurePolicy = %v, want %s", name, got, want)
	}
}

func checkTimeout(t *testing.T, name string, got *int32, want int32) {
	t.Helper()
	if got == nil || *got != want {
		t.Errorf("%s: timeoutSeconds = %v, want %d", name, got, want)
	}
}

func checkRules(t *testing.T, name string, rules []admissionv1.RuleWithOperations, want map[string][]string) {
	t.Helper()
	got := map[string][]string{}
	for _, r := range rules {
		if r.Scope == nil || *r.Scope != admissionv1.NamespacedScope {
			t.Errorf("%s: rule scope must be Namespaced", name)
		}
		for _, res := range r.Resources {
			for _, op := range r.Operations {
				got[res] = append(got[res], string(op))
			}
		}
	}
	for res := range got {
		got[res] = sorted(got[res])
	}
	for res := range want {
		want[res] = sorted(want[res])
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("%s: rules = %v, want %v", name, got, want)
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// checkController: the controller answers no review and holds what writes.
func checkController(t *testing.T, dep *appsv1.Deployment) {
	t.Helper()
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 1 {
		t.Errorf("controller replicas = %v, want 1", dep.Spec.Replicas)
	}
	ps := dep.Spec.Template.Spec
	if ps.ServiceAccountName != "gpuguard-controller" {
		t.Errorf("controller runs as %q, want its own account", ps.ServiceAccountName)
	}
	ct := ps.Containers[0]
	args := strings.Join(ct.Args, " ")
	for _, want := range []string{"--role=control", "--cel-backstop-owner=gpuguard-controller", "--prefilter-webhook=", "--audit-interval=", "--unguarded-namespace="} {
		if !strings.Contains(args, want) {
			t.Errorf("controller args lack %s: %q", want, args)
		}
	}
	for _, p := range ct.Ports {
		if p.Name == "https" {
			t.Error("the controller answers no review: no https port")
		}
	}
}

// TestWorkloads checks the webhook's availability and security settings and the agent's shape.
func TestWorkloads(t *testing.T) {
	c := loadChart(t)
	for _, rc := range cases {
		t.Run(rc.name, func(t *testing.T) {
			objs := decodeAll(t, docs(renderCaseValues(t, c, rc), false))
			dep := named[*appsv1.Deployment](t, objs, "gpuguard-webhook")
			checkController(t, named[*appsv1.Deployment](t, objs, "gpuguard-controller"))
			if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 2 {
				t.Errorf("webhook replicas = %v, want 2", dep.Spec.Replicas)
			}
			pdb := one[*policyv1.PodDisruptionBudget](t, objs)
			if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 1 {
				t.Errorf("PDB minAvailable = %v", pdb.Spec.MinAvailable)
			}
			ps := dep.Spec.Template.Spec
			if len(ps.TopologySpreadConstraints) == 0 || ps.TopologySpreadConstraints[0].TopologyKey != "kubernetes.io/hostname" {
				t.Errorf("webhook pods must spread across nodes: %+v", ps.TopologySpreadConstraints)
			}
			if ps.SecurityContext == nil || ps.SecurityContext.RunAsNonRoot == nil || !*ps.SecurityContext.RunAsNonRoot ||
				ps.SecurityContext.SeccompProfile == nil || ps.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Errorf("webhook pod securityContext is not restricted: %+v", ps.SecurityContext)
			}
			// Only webhook.hostNetwork (the platform-eks case) puts it on the node's network.
			hostNet := rc.name == "platform-eks"
			if ps.HostNetwork != hostNet || ps.HostPID || ps.HostIPC {
				t.Errorf("webhook pod shares host namespaces: network %v (want %v), PID %v, IPC %v", ps.HostNetwork, hostNet, ps.HostPID, ps.HostIPC)
			}
			for _, v := range ps.Volumes {
				if v.HostPath != nil {
					t.Errorf("webhook pod must not mount host paths: %s", v.Name)
				}
			}
			if len(ps.Containers) != 1 {
				t.Fatalf("want one webhook container")
			}
			ct := ps.Containers[0]
			sc := ct.SecurityContext
			if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
				sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Privileged == nil || *sc.Privileged ||
				sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 ||
				sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Errorf("webhook container securityContext is not restricted: %+v", sc)
			}
			if ct.Resources.Requests.Cpu().IsZero() || ct.Resources.Requests.Memory().IsZero() || ct.Resources.Limits.Memory().IsZero() {
				t.Errorf("webhook needs requests and limits: %+v", ct.Resources)
			}
			if ct.LivenessProbe == nil || ct.LivenessProbe.HTTPGet == nil || ct.LivenessProbe.HTTPGet.Path != "/healthz" ||
				ct.ReadinessProbe == nil || ct.ReadinessProbe.HTTPGet == nil || ct.ReadinessProbe.HTTPGet.Path != "/readyz" {
				t.Error("webhook probes must be /healthz (liveness) and /readyz (readiness)")
			}
			args := strings.Join(ct.Args, " ")
			for _, want := range []string{"--policy-configmap=" + namespace + "/gpuguard-policy", "--cert-dir=/certs", map[bool]string{false: "--port=9443", true: "--port=10260"}[hostNet]} {
				if !strings.Contains(args, want) {
					t.Errorf("webhook args %q lack %s", args, want)
				}
			}
			selfManaged := !strings.HasPrefix(rc.name, "cert-manager") && rc.name != "existing-secret"
			if strings.Contains(args, "--cert-secret=") != selfManaged {
				t.Errorf("--cert-secret must be set exactly in self-managed mode: %q", args)
			}
			if selfManaged {
				for _, want := range []string{"--cert-secret=" + namespace + "/gpuguard-webhook-tls", "--write-cert-dir"} {
					if !strings.Contains(args, want) {
						t.Errorf("self-managed: webhook args lack %s", want)
					}
				}
			}
			// The serving pods write nothing: the controller keeps the
			// certificate, the backstop, the pre-filter and the audit.
			for _, leave := range []string{"--prefilter-webhook", "--audit-interval", "--mutating-webhook-configuration", "--unguarded-namespace"} {
				if strings.Contains(args, leave) {
					t.Errorf("the serving pods must leave %s to the controller: %q", leave, args)
				}
			}
			if !strings.Contains(args, "--role=serve") {
				t.Errorf("webhook args lack --role=serve: %q", args)
			}
			// Self-managed: the webhook writes the files from its Secret into
			// a writable emptyDir; otherwise the kubelet mounts the Secret.
			wantSecret := map[string]string{"existing-secret": "corp-webhook-tls"}[rc.name]
			if wantSecret == "" && !selfManaged {
				wantSecret = "gpuguard-webhook-tls"
			}
			v, mount := ps.Volumes[0], ct.VolumeMounts[0]
			switch {
			case v.Name != "certs" || mount.Name != "certs":
				t.Errorf("first volume and mount must be the certificates: %s, %s", v.Name, mount.Name)
			case selfManaged && (v.EmptyDir == nil || mount.ReadOnly):
				t.Errorf("self-managed: certificate volume = %+v (read-only %v), want a writable emptyDir", v.VolumeSource, mount.ReadOnly)
			case !selfManaged && (v.Secret == nil || v.Secret.SecretName != wantSecret || !mount.ReadOnly):
				t.Errorf("certificate volume = %+v (read-only %v), want Secret %s read-only", v.VolumeSource, mount.ReadOnly, wantSecret)
			}
			secrets := findAll[*corev1.Secret](objs)
			if (len(secrets) == 1) != selfManaged || (selfManaged && len(secrets[0].Data)+len(secrets[0].StringData) != 0) {
				t.Errorf("an empty Secret is created exactly in self-managed mode, got %d", len(secrets))
			}

			agents := findAll[*appsv1.DaemonSet](objs)
			if rc.name == "agent-off" {
				if len(agents) != 0 {
					t.Error("agent.enabled=false still renders the DaemonSet")
				}
				return
			}
			if len(agents) != 1 {
				t.Fatal("want one agent DaemonSet")
			}
			as := agents[0].Spec.Template.Spec
			// GPU Feature Discovery's label or NFD's, either one.
			if as.Affinity == nil || as.Affinity.NodeAffinity == nil || as.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
				t.Fatalf("agent has no node affinity: %+v", as.Affinity)
			}
			var labels []string
			for _, term := range as.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
				if e := term.MatchExpressions[0]; e.Operator == corev1.NodeSelectorOpIn && slices.Equal(e.Values, []string{"true"}) {
					labels = append(labels, e.Key+"="+e.Values[0])
				} // else a platform's label (TestPlatformScheduling)
			}
			if !slices.Equal(labels, []string{"nvidia.com/gpu.present=true", "feature.node.kubernetes.io/pci-10de.present=true"}) {
				t.Errorf("agent runs on nodes with %v", labels)
			}
			a := as.Containers[0]
			if a.SecurityContext == nil || a.SecurityContext.Privileged == nil || !*a.SecurityContext.Privileged ||
				a.SecurityContext.RunAsUser == nil || *a.SecurityContext.RunAsUser != 0 {
				t.Errorf("agent must run privileged as root: %+v", a.SecurityContext)
			}
			if !slices.Contains(a.Args, "--device-plugin=auto") || !slices.Contains(a.Args, "--host-root=/host") {
				t.Errorf("agent args = %v", a.Args)
			}
			mounts := map[string]corev1.VolumeMount{}
			for _, m := range a.VolumeMounts {
				mounts[m.MountPath] = m
			}
			if m, ok := mounts["/var/lib/kubelet/device-plugins"]; !ok || m.ReadOnly {
				t.Error("agent needs the device plugin directory, writable")
			}
			if m, ok := mounts["/host"]; !ok || !m.ReadOnly {
				t.Error("agent needs the host (toolkit and containerd configs) read-only at /host")
			}
			// The verifier (on by default, in report mode) records Events.
			if as.AutomountServiceAccountToken == nil || !*as.AutomountServiceAccountToken {
				t.Error("agent API token not mounted; the verifier records Events")
			}
			checkVerifier(t, as, "report")
		})
	}
}

// rbacRule is one verb on one resource, in one scope, optionally for one name.
type rbacRule struct{ scope, group, resource, verb, name string }

func (r rbacRule) String() string {
	s := fmt.Sprintf("%s %s/%s %s", r.scope, r.group, r.resource, r.verb)
	if r.name != "" {
		s += " " + r.name
	}
	return s
}

// TestRBAC checks that the chart grants exactly the documented rules.
func TestRBAC(t *testing.T) {
	c := loadChart(t)
	for _, rc := range cases {
		t.Run(rc.name, func(t *testing.T) {
			objs := decodeAll(t, docs(renderCaseValues(t, c, rc), false))
			got := map[string][]string{}
			add := func(sa, scope string, rules []rbacv1.PolicyRule) {
				for _, r := range rules {
					if len(r.NonResourceURLs) > 0 {
						t.Errorf("non-resource rule %+v", r)
					}
					names := r.ResourceNames
					if len(names) == 0 {
						names = []string{""}
					}
					for _, g := range r.APIGroups {
						for _, res := range r.Resources {
							for _, v := range r.Verbs {
								for _, n := range names {
									if g == "*" || res == "*" || v == "*" {
										t.Errorf("wildcard in %+v", r)
									}
									got[sa] = append(got[sa], rbacRule{scope, g, res, v, n}.String())
								}
							}
						}
					}
				}
			}
			roles := map[string][]rbacv1.PolicyRule{}
			for _, cr := range findAll[*rbacv1.ClusterRole](objs) {
				roles["ClusterRole/"+cr.Name] = cr.Rules
			}
			for _, r := range findAll[*rbacv1.Role](objs) {
				roles["Role/"+r.Namespace+"/"+r.Name] = r.Rules
			}
			bound := map[string]bool{}
			for _, b := range findAll[*rbacv1.ClusterRoleBinding](objs) {
				bound["ClusterRole/"+b.RoleRef.Name] = true
				add(b.Subjects[0].Name, "cluster", roles["ClusterRole/"+b.RoleRef.Name])
			}
			for _, b := range findAll[*rbacv1.RoleBinding](objs) {
				key := "Role/" + b.Namespace + "/" + b.RoleRef.Name
				bound[key] = true
				add(b.Subjects[0].Name, b.Namespace, roles[key])
			}
			for k := range roles {
				if !bound[k] {
					t.Errorf("%s is not bound", k)
				}
			}

			ns := namespace
			want := []rbacRule{
				{"cluster", "", "namespaces", "get", ""},
				{"cluster", "", "namespaces", "list", ""},
				{"cluster", "", "namespaces", "watch", ""},
				{ns, "", "configmaps", "get", "gpuguard-policy"},
				{ns, "", "configmaps", "list", "gpuguard-policy"},
				{ns, "", "configmaps", "watch", "gpuguard-policy"},
				{ns, "events.k8s.io", "events", "create", ""},
				{ns, "events.k8s.io", "events", "patch", ""},
				// The node a pod is created bound to (unhonoured-gpu-request).
				{"cluster", "", "nodes", "get", ""},
			}
			if rc.name != "custom-policy" { // that policy does not inspect envFrom ConfigMaps
				want = append(want, rbacRule{"cluster", "", "configmaps", "get", ""})
			}
			if rc.name == "node-enforcer" {
				// injectVoid auto: the GPU nodes' labels, the DRA
				// ResourceSlices that make a node a GPU node, and the node
				// enforcers' Leases.
				want = append(want, rbacRule{"cluster", "", "nodes", "list", ""}, rbacRule{"cluster", "", "nodes", "watch", ""},
					rbacRule{"cluster", "resource.k8s.io", "resourceslices", "list", ""}, rbacRule{"cluster", "resource.k8s.io", "resourceslices", "watch", ""},
					rbacRule{ns, "coordination.k8s.io", "leases", "list", ""}, rbacRule{ns, "coordination.k8s.io", "leases", "watch", ""})
			}
			selfManaged := !strings.HasPrefix(rc.name, "cert-manager") && rc.name != "existing-secret"
			// The pods that serve reviews read; they write no admission
			// configuration and no Secret: the certificate is read from the
			// one Secret the controller keeps.
			serving := slices.Clone(want)
			if selfManaged {
				for _, v := range []string{"get", "list", "watch"} {
					serving = append(serving, rbacRule{ns, "", "secrets", v, "gpuguard-webhook-tls"})
				}
			}
			// The background audit: list what exists, write OpenReports, elect through a Lease.
			for _, r := range []struct{ group, resource string }{{"", "pods"}, {"", "replicationcontrollers"}, {"", "podtemplates"},
				{"apps", "deployments"}, {"apps", "replicasets"}, {"apps", "statefulsets"}, {"apps", "daemonsets"}, {"batch", "jobs"}, {"batch", "cronjobs"}} {
				want = append(want, rbacRule{"cluster", r.group, r.resource, "list", ""})
			}
			for _, v := range []string{"get", "list", "create", "update", "delete"} {
				want = append(want, rbacRule{"cluster", "openreports.io", "reports", v, ""})
			}
			want = append(want, rbacRule{ns, "coordination.k8s.io", "leases", "create", ""},
				rbacRule{ns, "coordination.k8s.io", "leases", "get", "gpuguard-audit"}, rbacRule{ns, "coordination.k8s.io", "leases", "update", "gpuguard-audit"})
			// The CEL backstop (every case renders for a 1.37 cluster).
			// Every grant on admission policies names its object, create
			// included: none may write admission configuration of any name.
			for _, res := range []string{"validatingadmissionpolicies", "validatingadmissionpolicybindings", "mutatingadmissionpolicies", "mutatingadmissionpolicybindings"} {
				for _, v := range []string{"get", "create", "patch"} {
					want = append(want, rbacRule{"cluster", "admissionregistration.k8s.io", res, v, "gpuguard-backstop"})
				}
			}
			// The KAI integration's ConfigMap guard, deleted while it is off.
			for _, res := range []string{"validatingadmissionpolicies", "validatingadmissionpolicybindings"} {
				for _, v := range []string{"get", "create", "patch", "delete"} {
					want = append(want, rbacRule{"cluster", "admissionregistration.k8s.io", res, v, "gpuguard-backstop-kai-configmaps"})
				}
			}
			// The owner of the backstop and of the webhook configurations:
			// the controller's own ClusterRole, which only helm uninstall
			// deletes.
			want = append(want, rbacRule{"cluster", "rbac.authorization.k8s.io", "clusterroles", "get", "gpuguard-controller"})
			// The webhook configurations, registered by the controller once
			// the Service has a ready endpoint, and the pre-filter on them:
			// its own two by name, create included.
			for _, res := range []string{"mutatingwebhookconfigurations", "validatingwebhookconfigurations"} {
				want = append(want, rbacRule{"cluster", "admissionregistration.k8s.io", res, "get", "gpuguard"},
					rbacRule{"cluster", "admissionregistration.k8s.io", res, "create", "gpuguard"},
					rbacRule{"cluster", "admissionregistration.k8s.io", res, "patch", "gpuguard"})
			}
			want = append(want, rbacRule{ns, "discovery.k8s.io", "endpointslices", "list", ""},
				rbacRule{ns, "discovery.k8s.io", "endpointslices", "watch", ""})
			if selfManaged {
				for _, res := range []string{"mutatingwebhookconfigurations", "validatingwebhookconfigurations"} {
					want = append(want,
						rbacRule{"cluster", "admissionregistration.k8s.io", res, "list", ""},
						rbacRule{"cluster", "admissionregistration.k8s.io", res, "watch", ""},
						rbacRule{"cluster", "admissionregistration.k8s.io", res, "update", "gpuguard"})
				}
				want = append(want,
					rbacRule{ns, "", "secrets", "list", ""},
					rbacRule{ns, "", "secrets", "watch", ""},
					rbacRule{ns, "", "secrets", "update", "gpuguard-webhook-tls"})
			}
			// Whatever the lists above say: no account of gpuguard's may write
			// admission configuration of any name, which would let it mutate
			// or admit anything.
			for sa, grants := range got {
				for _, g := range grants {
					f := strings.Fields(g) // scope, group/resource, verb[, name]
					if len(f) == 3 && strings.HasPrefix(f[1], "admissionregistration.k8s.io/") && slices.Contains([]string{"create", "patch", "update", "delete"}, f[2]) {
						t.Errorf("%s may %s admission configuration of any name: %s", sa, f[2], g)
					}
				}
			}
			checkGrants(t, "gpuguard-webhook", got["gpuguard-webhook"], serving)
			checkGrants(t, "gpuguard-controller", got["gpuguard-controller"], want)
			if w := writesOfServing(got["gpuguard-webhook"]); len(w) > 0 {
				t.Errorf("the pods that serve reviews may write %v", w)
			}
			var agentWant []rbacRule
			if rc.name != "agent-off" {
				agentWant = append(agentWant, rbacRule{"cluster", "", "events", "create", ""}, rbacRule{"cluster", "", "pods", "get", ""})
				for _, v := range []string{"get", "create", "update"} {
					agentWant = append(agentWant, rbacRule{"cluster", "openreports.io", "clusterreports", v, ""})
				}
				agentWant = append(agentWant, rbacRule{"cluster", "", "nodes", "get", ""})
			}
			if rc.name == "observability" {
				agentWant = append(agentWant, rbacRule{"cluster", "", "nodes", "patch", ""})
			}
			if rc.name == "node-enforcer" || rc.name == "observability" {
				// The enforcer's Lease, or the agent's own heartbeat of its
				// node labels, in the release namespace (the node-scope
				// policy holds each agent to its own node's).
				for _, v := range []string{"get", "create", "update"} {
					agentWant = append(agentWant, rbacRule{ns, "coordination.k8s.io", "leases", v, ""})
				}
			}
			if rc.name == "platform-openshift" {
				// The privileged SCC, in the release namespace only.
				agentWant = append(agentWant, rbacRule{ns, "security.openshift.io", "securitycontextconstraints", "use", "privileged"})
			}
			checkGrants(t, "gpuguard-agent", got["gpuguard-agent"], agentWant)
			for sa := range got {
				if sa != "gpuguard-webhook" && sa != "gpuguard-controller" && sa != "gpuguard-agent" {
					t.Errorf("unexpected subject %s", sa)
				}
			}
		})
	}
}

// writesOfServing lists the grants that would let a pod that serves reviews
// (reached by anything on the network) change admission: writes of
// admission configuration, Secrets (the serving certificate) or RBAC.
func writesOfServing(grants []string) []string {
	var out []string
	for _, g := range grants {
		f := strings.Fields(g) // scope, group/resource, verb[, name]
		writes := slices.Contains([]string{"create", "patch", "update", "delete"}, f[2])
		if writes && (strings.HasPrefix(f[1], "admissionregistration.k8s.io/") || f[1] == "/secrets" || strings.HasPrefix(f[1], "rbac.authorization.k8s.io/")) {
			out = append(out, g)
		}
	}
	return out
}

// TestServingPodsWriteNothingOfAdmission: the separation holds because the
// controller takes the writes; with it off (everything in the webhook
// pods) the same check finds them, so it can fail.
func TestServingPodsWriteNothingOfAdmission(t *testing.T) {
	c := loadChart(t)
	for _, separate := range []bool{true, false} {
		r, err := render(t, c, map[string]any{"webhook": map[string]any{"controller": map[string]any{"enabled": separate}}})
		if err != nil {
			t.Fatal(err)
		}
		var grants []string
		objs := decodeAll(t, docs(r, false))
		roles := map[string][]rbacv1.PolicyRule{}
		for _, cr := range findAll[*rbacv1.ClusterRole](objs) {
			roles["cluster/"+cr.Name] = cr.Rules
		}
		for _, ro := range findAll[*rbacv1.Role](objs) {
			roles["ns/"+ro.Name] = ro.Rules
		}
		bindings := map[string]string{}
		for _, b := range findAll[*rbacv1.ClusterRoleBinding](objs) {
			bindings["cluster/"+b.RoleRef.Name] = b.Subjects[0].Name
		}
		for _, b := range findAll[*rbacv1.RoleBinding](objs) {
			bindings["ns/"+b.RoleRef.Name] = b.Subjects[0].Name
		}
		for key, sa := range bindings {
			if sa != "gpuguard-webhook" {
				continue
			}
			for _, rule := range roles[key] {
				for _, g := range rule.APIGroups {
					for _, res := range rule.Resources {
						for _, v := range rule.Verbs {
							grants = append(grants, rbacRule{"x", g, res, v, ""}.String())
						}
					}
				}
			}
		}
		writes := writesOfServing(grants)
		if separate && len(writes) > 0 {
			t.Errorf("with the controller, the serving account may write %v", writes)
		}
		if !separate && len(writes) == 0 {
			t.Error("without the controller the serving account holds the writes; the check found none, so it proves nothing")
		}
	}
}

func checkGrants(t *testing.T, sa string, got []string, want []rbacRule) {
	t.Helper()
	var w []string
	for _, r := range want {
		w = append(w, r.String())
	}
	got, w = sorted(got), sorted(w)
	if !slices.Equal(got, w) {
		t.Errorf("%s is granted\n  %s\nwant exactly\n  %s", sa, strings.Join(got, "\n  "), strings.Join(w, "\n  "))
	}
}

// TestDefaultPolicyIsEmbedded: the chart's copy of the default policy is the
// embedded one, byte for byte, and the default ConfigMap holds exactly it but
// for its mode, warn: a first install denies nothing.
func TestDefaultPolicyIsEmbedded(t *testing.T) {
	copyInChart, err := os.ReadFile(filepath.Join(chartDir, "files", "policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(copyInChart, config.DefaultYAML()) {
		t.Fatalf("charts/gpuguard/files/policy.yaml differs from config/default.yaml: copy it over (cp config/default.yaml charts/gpuguard/files/policy.yaml)")
	}
	r := renderCaseValues(t, loadChart(t), cases[0])
	cm := policyConfigMap(t, r)
	if got := cm.Data[config.ConfigMapKey]; got != chartDefaultPolicy() {
		t.Fatalf("default policy ConfigMap differs from the embedded default in warn mode:\n%s", firstDiff(chartDefaultPolicy(), got))
	}
	p, err := config.Load("chart default", []byte(cm.Data[config.ConfigMapKey]))
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.Mode != config.ModeWarn {
		t.Errorf("the chart's default policy has mode %q, want warn", p.Spec.Mode)
	}
}

// renderedMode is the mode of the policy a rendering installs.
func renderedMode(t *testing.T, r *rendered) config.Mode {
	t.Helper()
	p, err := config.Load("chart", []byte(policyConfigMap(t, r).Data[config.ConfigMapKey]))
	if err != nil {
		t.Fatal(err)
	}
	return p.Spec.Mode
}

func policyConfigMap(t *testing.T, r *rendered) *corev1.ConfigMap {
	t.Helper()
	for _, o := range findAll[*corev1.ConfigMap](decodeAll(t, docs(r, false))) {
		if o.Name == "gpuguard-policy" {
			return o
		}
	}
	t.Fatal("no policy ConfigMap")
	return nil
}

// TestPolicies loads each rendered policy with gpuguard's own parser and engine.
func TestPolicies(t *testing.T) {
	c := loadChart(t)
	for _, rc := range cases {
		t.Run(rc.name, func(t *testing.T) {
			cm := policyConfigMap(t, renderCaseValues(t, c, rc))
			p, err := config.Load("chart "+rc.name, []byte(cm.Data[config.ConfigMapKey]))
			if err != nil {
				t.Fatalf("rendered policy does not load: %v\n%s", err, cm.Data[config.ConfigMapKey])
			}
			if _, err := policy.New(p); err != nil {
				t.Fatalf("rendered policy is rejected by the engine: %v", err)
			}
			ex := p.Spec.Exemptions
			switch rc.name {
			case "gpu-operator":
				if len(ex.Namespaces) != 0 {
					t.Errorf("the GPU Operator preset must not exempt whole namespaces: %v", ex.Namespaces)
				}
				var names []string
				for _, sa := range ex.ServiceAccounts {
					if sa.Namespace != "gpu-operator" {
						t.Errorf("exemption %+v outside gpu-operator", sa)
					}
					names = append(names, sa.Name)
				}
				for _, want := range []string{"nvidia-device-plugin", "nvidia-container-toolkit", "nvidia-dcgm-exporter", "nvidia-gpu-feature-discovery", "nvidia-operator-validator", "nvidia-mig-manager", "nvidia-driver"} {
					if !slices.Contains(names, want) {
						t.Errorf("GPU Operator preset lacks %s", want)
					}
				}
				// Everything else keeps the default.
				if p.Spec.Mode != config.ModeWarn || !slices.Equal(p.Spec.GPUResources, config.Default().Spec.GPUResources) {
					t.Error("the preset changed more than the exemptions")
				}
			case "custom-policy":
				if p.Spec.Mode != "warn" || p.Spec.Action != "strip" || len(ex.ServiceAccounts) != 1 {
					t.Errorf("custom policy not applied: mode %s action %s exemptions %+v", p.Spec.Mode, p.Spec.Action, ex)
				}
			case "custom-document":
				if p.Metadata.Name != "strict" || p.Spec.Advisories.Privileged != "deny" {
					t.Errorf("policy.document not used as is")
				}
			}
		})
	}
}

// TestValuesRejected: the schema and the templates refuse bad values at install time.
func TestValuesRejected(t *testing.T) {
	c := loadChart(t)
	for name, tc := range map[string]struct{ values, want string }{
		"typo at top level":   {"agnet: {enabled: false}", "agnet"},
		"typo in webhook":     {"webhook: {replica: 3}", "replica"},
		"unknown cert mode":   {"certificates: {mode: self-signed}", "mode"},
		"bad policy mode":     {"policy: {mode: enforcing}", "mode"},
		"timeout too long":    {"admission: {timeoutSeconds: {validatePods: 31}}", "validatePods"},
		"secret without name": {"certificates: {mode: secret}", "existingSecret"},
		"document and preset": {"policy: {document: 'kind: GPUGuardPolicy', presets: {gpuOperator: {enabled: true}}}", "policy.document"},
		"excluded test ns":    {"test: {namespace: kube-system}", "test.namespace"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := render(t, c, parseValues(t, tc.values))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want an error naming %q, got %v", tc.want, err)
			}
		})
	}
}

// TestBackstop: the webhook keeps the CEL backstop applied where the API server
// serves both admission policy APIs, with exactly the RBAC that needs; elsewhere, or
// when turned off, neither; and the pods' webhook may fail open only with it.
func TestBackstop(t *testing.T) {
	c := loadChart(t)
	args := func(r *chartrender.Release) string { return webhookDeployment(t, r) }
	on, err := chartrender.Render(c, releaseName, namespace, nil, clusterAPIs...)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"- --cel-backstop\n", "- --cel-backstop-name=gpuguard-backstop", "- --cel-backstop-exclude-namespace=gpuguard-system",
		"- --cel-backstop-exclude-namespace=kube-system"} {
		if !strings.Contains(args(on), want) {
			t.Errorf("the webhook lacks %s", want)
		}
	}
	if !strings.Contains(on.Raw, "mutatingadmissionpolicies") {
		t.Error("no RBAC for the backstop")
	}
	for name, values := range map[string]map[string]any{
		"turned off":      {"backstop": map[string]any{"enabled": false}},
		"not served here": nil,
	} {
		apis := clusterAPIs
		if values == nil {
			apis = clusterAPIs[:3] // ValidatingAdmissionPolicy, not MutatingAdmissionPolicy
		}
		off, err := chartrender.Render(c, releaseName, namespace, values, apis...)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(args(off), "--cel-backstop") || strings.Contains(off.Raw, "admissionpolicies") {
			t.Errorf("%s: the backstop must not be set up", name)
		}
		failOpen := map[string]any{"webhook": map[string]any{"failurePolicy": "Ignore"}, "policy": map[string]any{"mode": "enforce"}}
		if values != nil {
			failOpen["backstop"] = values["backstop"]
		}
		_, err = chartrender.Render(c, releaseName, namespace, failOpen, apis...)
		if err == nil || !strings.Contains(err.Error(), "needs the CEL backstop") {
			t.Errorf("%s: failing open without the backstop must be refused, got %v", name, err)
		}
	}
	open, err := chartrender.Render(c, releaseName, namespace, map[string]any{"webhook": map[string]any{"failurePolicy": "Ignore"}, "policy": map[string]any{"mode": "enforce"}}, clusterAPIs...)
	if err != nil {
		t.Fatal(err)
	}
	// Webhooks only: the agent's node-scope policy fails closed whatever
	// the webhooks do, as it guards the agent's token, not admission.
	objs := decodeAll(t, docs(&rendered{Release: open}, false))
	if len(findAll[*admissionv1.MutatingWebhookConfiguration](objs)) == 0 || len(findAll[*admissionv1.ValidatingWebhookConfiguration](objs)) == 0 {
		t.Fatal("the rendering has no webhook configurations to judge")
	}
	for _, m := range findAll[*admissionv1.MutatingWebhookConfiguration](objs) {
		for _, w := range m.Webhooks {
			if w.FailurePolicy != nil && *w.FailurePolicy == admissionv1.Fail {
				t.Errorf("with webhook.failurePolicy=Ignore, webhook %s fails closed", w.Name)
			}
		}
	}
	for _, v := range findAll[*admissionv1.ValidatingWebhookConfiguration](objs) {
		for _, w := range v.Webhooks {
			if w.FailurePolicy != nil && *w.FailurePolicy == admissionv1.Fail {
				t.Errorf("with webhook.failurePolicy=Ignore, webhook %s fails closed", w.Name)
			}
		}
	}
}

// The helm test pod runs gpuguard verify expecting what the policy makes of
// a violating pod: test.expect auto follows the mode and the action.
func TestHelmTestExpectation(t *testing.T) {
	c := loadChart(t)
	for _, tc := range []struct{ name, values, want string }{
		{"default", ``, "warn"},
		{"enforce mode", "policy:\n  mode: enforce\n", "deny"},
		{"warn mode", "policy:\n  mode: warn\n", "warn"},
		{"audit mode", "policy:\n  mode: audit\n", "admit"},
		{"strip action", "policy:\n  spec:\n    mode: enforce\n    action: strip\n", "strip"},
		{"strip action, warn mode", "policy:\n  mode: warn\n  spec:\n    action: strip\n", "warn"},
		{"explicit", "policy:\n  mode: audit\ntest:\n  expect: deny\n", "deny"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := render(t, c, parseValues(t, tc.values))
			if err != nil {
				t.Fatal(err)
			}
			pod := one[*corev1.Pod](t, decodeAll(t, docs(r, true)))
			args := pod.Spec.Containers[0].Args
			if !slices.Equal(args, []string{"verify", "--namespace", "default", "--expect", tc.want}) {
				t.Errorf("test pod args %q, want verify expecting %s", args, tc.want)
			}
		})
	}
}

// checkVerifier checks the agent pod for the node verifier in mode: the host's
// PID namespace, the PodResources socket, the policy and the mode itself.
func checkVerifier(t *testing.T, as corev1.PodSpec, mode string) {
	t.Helper()
	a := as.Containers[0]
	on := mode != "off"
	if as.HostPID != on {
		t.Errorf("agent hostPID = %v with --verify=%s", as.HostPID, mode)
	}
	if !slices.Contains(a.Args, "--verify="+mode) {
		t.Errorf("agent args %v lack --verify=%s", a.Args, mode)
	}
	hasPolicy := slices.ContainsFunc(a.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/etc/gpuguard" && m.ReadOnly })
	hasSocket := slices.Contains(a.Args, "--pod-resources-socket=/host/var/lib/kubelet/pod-resources/kubelet.sock")
	if hasPolicy != on || hasSocket != on {
		t.Errorf("--verify=%s: policy mounted %v, PodResources socket given %v", mode, hasPolicy, hasSocket)
	}
}

// TestAgentVerifierModes: enforce adds pod deletion (not eviction, which a
// PodDisruptionBudget holds back) to the agent's grants, off
// takes away the token, the host PID namespace and the grants; the GPU
// Operator preset adds the operator's namespace to the verifier's exempt ones.
func TestAgentVerifierModes(t *testing.T) {
	c := loadChart(t)
	for _, tc := range []struct {
		mode, values string
		grants       []string
		token        bool
	}{
		{"enforce", "agent: {verify: {mode: enforce}}", []string{"cluster /clusterreports create", "cluster /clusterreports get", "cluster /clusterreports update",
			"cluster /events create", "cluster /nodes get", "cluster /pods delete", "cluster /pods get"}, true},
		{"off", "agent: {verify: {mode: off}}", nil, false},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			objs := decodeAll(t, docs(renderCaseValues(t, c, renderCase{tc.mode, tc.values}), false))
			as := one[*appsv1.DaemonSet](t, objs).Spec.Template.Spec
			checkVerifier(t, as, tc.mode)
			if token := as.AutomountServiceAccountToken != nil && *as.AutomountServiceAccountToken; token != tc.token {
				t.Errorf("token mounted = %v, want %v", token, tc.token)
			}
			var grants []string
			for _, r := range findAll[*rbacv1.ClusterRole](objs) {
				if r.Name != "gpuguard-agent" {
					continue
				}
				for _, rule := range r.Rules {
					for _, res := range rule.Resources {
						for _, v := range rule.Verbs {
							grants = append(grants, "cluster /"+res+" "+v)
						}
					}
				}
			}
			slices.Sort(grants)
			if !slices.Equal(grants, tc.grants) {
				t.Errorf("agent grants %v, want %v", grants, tc.grants)
			}
		})
	}
	objs := decodeAll(t, docs(renderCaseValues(t, c, renderCase{"operator", "policy: {presets: {gpuOperator: {enabled: true}}}\nagent: {verify: {exemptNamespaces: [dcgm]}}"}), false))
	a := one[*appsv1.DaemonSet](t, objs).Spec.Template.Spec.Containers[0]
	if !slices.Contains(a.Args, "--verify-exempt-namespaces=dcgm") {
		t.Errorf("agent args %v: want the listed namespace exempt, and not the GPU Operator's: its preset exempts its service accounts", a.Args)
	}
}

// TestOpenReportsCRDsMatchTheModule: the chart's OpenReports CRDs are the ones of
// the reports-api module at the version go.mod pins, whose Go types the webhook
// writes (hack/openreports-crds.sh copies them).
func TestOpenReportsCRDsMatchTheModule(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}} {{.Version}}", "github.com/openreports/reports-api").Output()
	if err != nil {
		t.Fatalf("locating the reports-api module: %v", err)
	}
	dir, version, _ := strings.Cut(strings.TrimSpace(string(out)), " ")
	pinned, err := os.ReadFile(filepath.Join("gpuguard", "files", "openreports", "VERSION"))
	if err != nil || strings.TrimSpace(string(pinned)) != version {
		t.Errorf("the chart's CRDs are of %q, go.mod pins %s: run hack/openreports-crds.sh", pinned, version)
	}
	for _, f := range []string{"openreports.io_reports.yaml", "openreports.io_clusterreports.yaml"} {
		want, err := os.ReadFile(filepath.Join(dir, "config", "crd", f))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join("gpuguard", "files", "openreports", f))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s differs from reports-api %s (%v): run hack/openreports-crds.sh", f, version, err)
		}
	}
}

// TestOpenReportsCRDsOnlyWhereAbsent: the CRDs come with the chart where the
// cluster lacks them, kept on uninstall, and not where it serves them already
// or where reports are off.
func TestOpenReportsCRDsOnlyWhereAbsent(t *testing.T) {
	c := loadChart(t)
	crds := func(values string, apis ...string) []*apiextensionsv1.CustomResourceDefinition {
		rel, err := chartrender.Render(c, releaseName, namespace, parseValues(t, values), append(slices.Clone(clusterAPIs), apis...)...)
		if err != nil {
			t.Fatal(err)
		}
		return findAll[*apiextensionsv1.CustomResourceDefinition](decodeAll(t, rel.Documents(false)))
	}
	got := crds("")
	if len(got) != 2 || got[0].Name != "reports.openreports.io" || got[1].Name != "clusterreports.openreports.io" {
		t.Fatalf("want the Report and ClusterReport CRDs, got %d", len(got))
	}
	for _, crd := range got {
		if crd.Annotations["helm.sh/resource-policy"] != "keep" {
			t.Errorf("%s is not kept on uninstall", crd.Name)
		}
	}
	if n := len(crds("", "openreports.io/v1alpha1/Report")); n != 0 {
		t.Errorf("the cluster serves OpenReports already, yet the chart renders %d CRDs", n)
	}
	if n := len(crds("reports: {enabled: false}")); n != 0 {
		t.Errorf("reports.enabled=false still renders %d CRDs", n)
	}
}

// TestPDBLeavesDrainsPossible: one replica gets no budget, which would block
// every drain, and a budget that would is refused with a message.
func TestPDBLeavesDrainsPossible(t *testing.T) {
	c := loadChart(t)
	r, err := render(t, c, map[string]any{"webhook": map[string]any{"replicas": 1}})
	if err != nil {
		t.Fatal(err)
	}
	if pdbs := findAll[*policyv1.PodDisruptionBudget](decodeAll(t, docs(r, false))); len(pdbs) != 0 {
		t.Errorf("one replica: %d PodDisruptionBudgets rendered, want none", len(pdbs))
	}
	_, err = render(t, c, map[string]any{"webhook": map[string]any{"replicas": 2, "podDisruptionBudget": map[string]any{"minAvailable": 2}}})
	if err == nil || !strings.Contains(err.Error(), "would block every node drain") {
		t.Errorf("minAvailable 2 of 2 replicas: %v", err)
	}
	r, err = render(t, c, map[string]any{"webhook": map[string]any{"replicas": 3, "podDisruptionBudget": map[string]any{"minAvailable": "50%"}}})
	if err != nil || len(findAll[*policyv1.PodDisruptionBudget](decodeAll(t, docs(r, false)))) != 1 {
		t.Errorf("a percentage budget with 3 replicas: %v", err)
	}
}

// webhookDeployment is the rendered webhook Deployment, as text.
func webhookDeployment(t *testing.T, r *chartrender.Release) string {
	t.Helper()
	for _, d := range r.Documents(false) {
		if strings.Contains(d, "\nkind: Deployment") {
			return d
		}
	}
	t.Fatal("no Deployment rendered")
	return ""
}

// TestAdmissionProfile: the pre-filter is on by default and can be turned
// off (then the webhook neither gets the flag nor may patch its
// configurations); --inject-void=auto reads the GPU nodes the agent runs
// on, and is refused without the agents' node labels.
func TestAdmissionProfile(t *testing.T) {
	c := loadChart(t)
	deployment := func(r *chartrender.Release) string { return webhookDeployment(t, r) }
	off, err := chartrender.Render(c, releaseName, namespace, map[string]any{"admission": map[string]any{"prefilter": false}}, clusterAPIs...)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(deployment(off), "--prefilter-webhook") || strings.Contains(off.Raw, `verbs: ["get", "patch"]`) {
		t.Error("admission.prefilter=false: no pre-filter flag, and no right to patch the webhook configurations")
	}
	auto := map[string]any{"admission": map[string]any{"injectVoid": "auto"}}
	if _, err := chartrender.Render(c, releaseName, namespace, auto, clusterAPIs...); err == nil || !strings.Contains(err.Error(), "agent.publishNodeLabels") {
		t.Errorf("injectVoid=auto without the agents' node labels must be refused, got %v", err)
	}
	auto["agent"] = map[string]any{"publishNodeLabels": true}
	r, err := chartrender.Render(c, releaseName, namespace, auto, clusterAPIs...)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"- --inject-void=auto", "- --gpu-node-label=nvidia.com/gpu.present=true",
		"- --gpu-node-label=feature.node.kubernetes.io/pci-10de.present=true"} {
		if !strings.Contains(deployment(r), want) {
			t.Errorf("injectVoid=auto: the webhook lacks %s", want)
		}
	}
	if !strings.Contains(r.Raw, `resources: ["nodes"]`+"\n    verbs: [\"list\", \"watch\"]") {
		t.Error("injectVoid=auto: the webhook cannot watch the nodes")
	}
	if _, err := chartrender.Render(c, releaseName, namespace, map[string]any{"admission": map[string]any{"injectVoid": "sometimes"}}, clusterAPIs...); err == nil {
		t.Error("injectVoid=sometimes must be refused by the schema")
	}
}

// TestAgentSecurityContext: privileged root by default; agent.securityContext
// replaces it whole.
func TestAgentSecurityContext(t *testing.T) {
	c := loadChart(t)
	agentContainer := func(values map[string]any) corev1.Container {
		r, err := chartrender.Render(c, releaseName, namespace, values, clusterAPIs...)
		if err != nil {
			t.Fatal(err)
		}
		ds := one[*appsv1.DaemonSet](t, decodeAll(t, r.Documents(false)))
		return ds.Spec.Template.Spec.Containers[0]
	}
	def := agentContainer(nil).SecurityContext
	if def == nil || def.Privileged == nil || !*def.Privileged {
		t.Errorf("by default the agent is privileged: %+v", def)
	}
	least := agentContainer(map[string]any{"agent": map[string]any{"securityContext": map[string]any{
		"runAsUser": 0, "allowPrivilegeEscalation": false, "capabilities": map[string]any{"drop": []any{"ALL"}, "add": []any{"SYS_PTRACE"}}}}}).SecurityContext
	if least.Privileged != nil || least.AllowPrivilegeEscalation == nil || *least.AllowPrivilegeEscalation ||
		least.Capabilities == nil || len(least.Capabilities.Add) != 1 || least.Capabilities.Add[0] != "SYS_PTRACE" {
		t.Errorf("agent.securityContext must replace the default whole: %+v", least)
	}
}

// TestImagePullSecretsEverywhere: every pod the chart runs, the hooks and
// the test pod included, pulls with the Secrets of imagePullSecrets, given
// as names or as {name: ...}. The policy-check hook once rendered them as
// bare strings, which the API server refuses, so an install from a private
// registry failed at its first hook.
func TestImagePullSecretsEverywhere(t *testing.T) {
	r, err := render(t, loadChart(t), parseValues(t, "imagePullSecrets: [corp-registry, {name: mirror}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []corev1.LocalObjectReference{{Name: "corp-registry"}, {Name: "mirror"}}
	pods := 0
	for _, tpl := range podTemplates(t, r) {
		pods++
		if !slices.Equal(tpl.Template.Spec.ImagePullSecrets, want) {
			t.Errorf("%s: imagePullSecrets %v, want %v", tpl.Path, tpl.Template.Spec.ImagePullSecrets, want)
		}
	}
	if pods < 4 { // webhook, agent, policy-check hook, helm test pod
		t.Fatalf("found %d pod specs, want the webhook's, the agent's, the hook's and the test pod's", pods)
	}
	if _, err := render(t, loadChart(t), parseValues(t, "imagePullSecrets: [{}]\n")); err == nil {
		t.Error("an imagePullSecrets entry without a name must be refused")
	}
}

// TestOpenReportsCRDsSwitch: reports.crds.install auto renders the CRDs
// only where the cluster lacks them (helm install beside another tool's
// copy), true always (GitOps tools render without a cluster, and pruned
// the CRDs once they dropped out of the rendering), false never; each kept
// on uninstall.
func TestOpenReportsCRDsSwitch(t *testing.T) {
	c := loadChart(t)
	withCRDs := append(slices.Clone(clusterAPIs), "openreports.io/v1alpha1/Report")
	for _, tc := range []struct {
		install string
		apis    []string
		want    int
	}{
		{"auto", clusterAPIs, 2},
		{"auto", withCRDs, 0},
		{"true", withCRDs, 2},
		{"false", clusterAPIs, 0},
	} {
		rel, err := chartrender.Render(c, releaseName, namespace, parseValues(t, "reports: {crds: {install: "+tc.install+"}}\n"), tc.apis...)
		if err != nil {
			t.Fatalf("install %s: %v", tc.install, err)
		}
		n := 0
		for _, doc := range strings.Split(rel.Raw, "\n---") {
			if strings.Contains(doc, "kind: CustomResourceDefinition") && strings.Contains(doc, "openreports.io") {
				n++
				if !strings.Contains(doc, "helm.sh/resource-policy: keep") {
					t.Errorf("install %s: a CRD without helm.sh/resource-policy: keep", tc.install)
				}
			}
		}
		if n != tc.want {
			t.Errorf("install %s (cluster serves them: %v): %d CRDs, want %d", tc.install, len(tc.apis) > len(clusterAPIs), n, tc.want)
		}
	}
	if _, err := chartrender.Render(c, releaseName, namespace, parseValues(t, "reports: {crds: {install: sometimes}}\n"), clusterAPIs...); err == nil {
		t.Error("reports.crds.install: sometimes must be refused")
	}
}

// TestPlatformOptions: on OpenShift the restricted SCC picks the user, so
// unsetting runAsUser and runAsGroup takes them out of every non-agent pod
// while the rest of the securityContext stays; on GKE a ResourceQuota covers
// the system-*-critical priority classes the chart's pods use, and is
// rendered only when asked for.
func TestPlatformOptions(t *testing.T) {
	c := loadChart(t)
	r, err := render(t, c, parseValues(t, `
podSecurityContext: {runAsUser: null, runAsGroup: null}
priorityClassQuota: {create: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	pods := 0
	for _, tpl := range podTemplates(t, r) {
		spec := tpl.Template.Spec
		if len(spec.Containers) == 0 || spec.Containers[0].Name == "agent" {
			continue // the agent has agent.securityContext
		}
		pods++
		sc := spec.SecurityContext
		if sc == nil || sc.RunAsUser != nil || sc.RunAsGroup != nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
			t.Errorf("%s: pod securityContext %+v, want runAsNonRoot without a user or group", tpl.Path, sc)
		}
		if csc := spec.Containers[0].SecurityContext; csc == nil || csc.ReadOnlyRootFilesystem == nil || !*csc.ReadOnlyRootFilesystem {
			t.Errorf("%s: container securityContext %+v lost its defaults", tpl.Path, csc)
		}
	}
	if pods < 3 { // webhook, policy-check hook, helm test pod
		t.Fatalf("found %d pod specs besides the agent's, want 3", pods)
	}
	q := one[*corev1.ResourceQuota](t, decodeAll(t, docs(r, false)))
	if q.Namespace != namespace || q.Spec.ScopeSelector == nil || len(q.Spec.ScopeSelector.MatchExpressions) != 1 {
		t.Fatalf("quota %s/%s: %+v", q.Namespace, q.Name, q.Spec)
	}
	if got, want := q.Spec.ScopeSelector.MatchExpressions[0].Values, []string{"system-cluster-critical", "system-node-critical"}; !slices.Equal(got, want) {
		t.Errorf("the quota covers %v, want %v", got, want)
	}
	r, err = render(t, c, parseValues(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	if q := findAll[*corev1.ResourceQuota](decodeAll(t, docs(r, false))); len(q) != 0 {
		t.Errorf("a ResourceQuota rendered without priorityClassQuota.create")
	}
}

// podTemplates are the pod templates of every rendered object, hooks
// included.
func podTemplates(t *testing.T, r *rendered) []manifest.EmbeddedPodTemplate {
	t.Helper()
	var out []manifest.EmbeddedPodTemplate
	for _, doc := range docs(r, true) {
		found, err := manifest.PodTemplates([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, found...)
	}
	return out
}

// TestNodeScopeCannotVanish: the agent's cluster-wide grants come with the
// node-scope policy or not at all. A renderer told nothing of the cluster
// (helm template, GitOps tools) or a cluster without the policy API gets an
// error naming the setting, not an unscoped agent; agent.nodeScope=false
// is the operator's explicit choice, and an agent that needs no grants
// needs no policy.
func TestNodeScopeCannotVanish(t *testing.T) {
	c := loadChart(t)
	noVAP := clusterAPIs[:2]
	if _, err := chartrender.Render(c, releaseName, namespace, nil, noVAP...); err == nil || !strings.Contains(err.Error(), "agent.nodeScope") ||
		!strings.Contains(err.Error(), "--api-versions") {
		t.Errorf("the default agent without the policy API must be refused, naming agent.nodeScope and --api-versions; got %v", err)
	}
	for name, values := range map[string]map[string]any{
		"agent.nodeScope=false": {"agent": map[string]any{"nodeScope": false}},
		"an agent with no API":  {"agent": map[string]any{"verify": map[string]any{"mode": "off"}}},
	} {
		r, err := chartrender.Render(c, releaseName, namespace, values, noVAP...)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if strings.Contains(r.Raw, "-node-scope") {
			t.Errorf("%s: no node-scope policy can render without its API", name)
		}
	}
	auto := map[string]any{"admission": map[string]any{"injectVoid": "auto"}, "agent": map[string]any{"enforce": true, "nodeScope": false}}
	if _, err := chartrender.Render(c, releaseName, namespace, auto, noVAP...); err == nil || !strings.Contains(err.Error(), "admission.injectVoid=auto") {
		t.Errorf("injectVoid=auto without the coverage-leases policy must be refused, got %v", err)
	}
}

// TestCoverageLeasesPolicy: wherever agents write coverage Leases, every
// writer of those names is held to the agent of that node, and to the
// duration the agents write and the webhook caps (one number).
func TestCoverageLeasesPolicy(t *testing.T) {
	c := loadChart(t)
	for name, tc := range map[string]struct {
		values map[string]any
		want   bool
	}{
		"default (no Leases)":  {nil, false},
		"the node enforcer":    {map[string]any{"agent": map[string]any{"enforce": true}}, true},
		"published labels":     {map[string]any{"agent": map[string]any{"publishNodeLabels": true}}, true},
		"agent off, enforcing": {map[string]any{"agent": map[string]any{"enabled": false, "enforce": true}}, false},
	} {
		r, err := chartrender.Render(c, releaseName, namespace, tc.values, clusterAPIs...)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var vap *admissionv1.ValidatingAdmissionPolicy
		for _, p := range findAll[*admissionv1.ValidatingAdmissionPolicy](decodeAll(t, r.Documents(false))) {
			if p.Name == "gpuguard-agent-coverage-leases" {
				vap = p
			}
		}
		if (vap != nil) != tc.want {
			t.Errorf("%s: coverage-leases policy rendered %v, want %v", name, vap != nil, tc.want)
		}
		if vap == nil {
			continue
		}
		if vap.Spec.FailurePolicy == nil || *vap.Spec.FailurePolicy != admissionv1.Fail {
			t.Errorf("%s: the policy must fail closed", name)
		}
		bound := fmt.Sprintf("object.spec.leaseDurationSeconds <= %d", wellknown.CoverageLeaseSeconds)
		var found bool
		for _, v := range vap.Spec.Validations {
			found = found || strings.Contains(v.Expression, bound)
		}
		if !found {
			t.Errorf("%s: no validation bounds the duration to wellknown.CoverageLeaseSeconds (%s)", name, bound)
		}
		if slices.Contains(vap.Spec.MatchConstraints.ResourceRules[0].Operations, admissionv1.Delete) {
			t.Errorf("%s: deleting a Lease only ends coverage; it must stay open to the namespace's cleanup", name)
		}
	}
}

// TestWebhookConfigurationsRegisteredByTheWebhook: no webhook configuration
// is a resource of the release, in any case: the chart renders them into a
// ConfigMap the applying pods mount, and they register them once a replica
// is ready. A release resource would exist before any replica, and outlive
// a failed install.
func TestWebhookConfigurationsRegisteredByTheWebhook(t *testing.T) {
	c := loadChart(t)
	for _, rc := range cases {
		t.Run(rc.name, func(t *testing.T) {
			r := renderCaseValues(t, c, rc)
			objs := decodeAll(t, r.Documents(true))
			if n := len(findAll[*admissionv1.MutatingWebhookConfiguration](objs)) + len(findAll[*admissionv1.ValidatingWebhookConfiguration](objs)); n != 0 {
				t.Errorf("%d webhook configurations are resources of the release", n)
			}
			applier := "gpuguard-controller"
			if !strings.Contains(r.Raw, "name: "+applier+"\n") {
				applier = "gpuguard-webhook"
			}
			d := named[*appsv1.Deployment](t, objs, applier)
			args := d.Spec.Template.Spec.Containers[0].Args
			for _, want := range []string{"--webhook-configurations-file=/etc/gpuguard/webhook-configurations/configurations.yaml",
				"--webhook-configurations-owner=" + applier, "--mutating-webhook-configuration=gpuguard", "--validating-webhook-configuration=gpuguard"} {
				if !slices.Contains(args, want) {
					t.Errorf("%s lacks %s", applier, want)
				}
			}
			if !slices.ContainsFunc(d.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool {
				return v.ConfigMap != nil && v.ConfigMap.Name == "gpuguard-webhook-configurations"
			}) {
				t.Errorf("%s does not mount the webhook configurations", applier)
			}
		})
	}
}
