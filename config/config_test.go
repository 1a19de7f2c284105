package config_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/gpuguard/gpuguard/config"
)

const head = "apiVersion: gpuguard.io/v1alpha1\nkind: GPUGuardPolicy\n"

func TestDefault(t *testing.T) {
	p := config.Default()
	s := p.Spec
	if s.Mode != config.ModeEnforce || s.Action != config.ActionDeny || !s.InjectVoid {
		t.Errorf("defaults must be enforce, deny, inject: got %s, %s, %v", s.Mode, s.Action, s.InjectVoid)
	}
	if s.NamespaceModeOverride != config.OverrideTightenOnly || s.Env.UnprefixedEnvFromOnGPU != config.EnvFromInspect {
		t.Errorf("namespace override %s, envFrom %s", s.NamespaceModeOverride, s.Env.UnprefixedEnvFromOnGPU)
	}
	if got := strings.Join(s.GPUResources, ","); got != "nvidia.com/gpu,nvidia.com/gpu.shared,nvidia.com/mig-*" {
		t.Errorf("gpuResources = %s", got)
	}
	if len(s.Env.ProtectedVariables) != 9 || s.Advisories.Privileged != config.SeverityDeny || s.Advisories.Capabilities != config.SeverityWarn {
		t.Errorf("protected variables %d, privileged %s, capabilities %s", len(s.Env.ProtectedVariables), s.Advisories.Privileged, s.Advisories.Capabilities)
	}
	if _, err := config.Parse("default.yaml", config.DefaultYAML()); err != nil {
		t.Errorf("the shipped default does not parse: %v", err)
	}
}

func TestOmittedFieldsKeepDefaults(t *testing.T) {
	p, err := config.Parse("p.yaml", []byte(head+"spec:\n  mode: warn\n  env:\n    protectedVariables:\n      - name: NVIDIA_GDS\n"))
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.Mode != config.ModeWarn || !p.Spec.InjectVoid || len(p.Spec.GPUResources) != 3 {
		t.Errorf("mode %s inject %v gpuResources %v", p.Spec.Mode, p.Spec.InjectVoid, p.Spec.GPUResources)
	}
	if p.Spec.Env.UnprefixedEnvFromOnGPU != config.EnvFromInspect {
		t.Errorf("a field left out of env lost its default: %q", p.Spec.Env.UnprefixedEnvFromOnGPU)
	}
	// A list given replaces the default whole: nothing of the default's first entry
	// (NVIDIA_DRIVER_CAPABILITIES, allowed on GPU containers) may leak into it.
	pv := p.Spec.Env.ProtectedVariables
	if len(pv) != 1 || pv[0].Name != "NVIDIA_GDS" || pv[0].AllowOnGPUContainers || len(pv[0].AllowedValues) != 0 {
		t.Errorf("protectedVariables = %+v", pv)
	}
	if p.Spec.Mode == config.Default().Spec.Mode {
		t.Error("Default() must not share state with parsed policies")
	}
}

func TestConfigMapWrapper(t *testing.T) {
	cm := "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: gpuguard-policy}\ndata:\n  policy.yaml: |\n    " +
		strings.ReplaceAll(head, "\n", "\n    ") + "spec:\n      mode: audit\n"
	p, err := config.Load("cm.yaml", []byte(cm))
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.Mode != config.ModeAudit {
		t.Errorf("mode = %s", p.Spec.Mode)
	}
}

func TestErrors(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		want      []string // substrings of the error, in order
	}{
		{"unknown field", head + "spec:\n  mode: warn\n  mdoe: warn\n", []string{"p.yaml:5: spec.mdoe: unknown field", "injectVoid"}},
		{"unknown top field", head + "specs: {}\n", []string{"p.yaml:3: specs: unknown field"}},
		{"bad enum", head + "spec:\n  mode: enforcing\n", []string{"p.yaml:4: spec.mode: Unsupported value: \"enforcing\"", `"enforce", "warn", "audit"`}},
		{"bad action", head + "spec:\n  action: drop\n", []string{"p.yaml:4: spec.action"}},
		{"bool as string", head + "spec:\n  injectVoid: \"yes\"\n", []string{"p.yaml:4: spec.injectVoid: must be true or false"}},
		{"list as scalar", head + "spec:\n  gpuResources: nvidia.com/gpu\n", []string{"p.yaml:4: spec.gpuResources: must be a list"}},
		{"bad pattern", head + "spec:\n  gpuResources: [nvidia.com/gpu, 'nvidia.com/[mig']\n", []string{"p.yaml:4: spec.gpuResources[1]", "bad pattern"}},
		{"empty gpu resources", head + "spec:\n  gpuResources: []\n", []string{"spec.gpuResources: Required value"}},
		{"number for string", head + "spec:\n  nvidiaRuntimeClasses: [12]\n", []string{"spec.nvidiaRuntimeClasses[0]: must be a string"}},
		{"visible devices listed", head + "spec:\n  env:\n    extraDeviceVariables: [NVIDIA_VISIBLE_DEVICES]\n", []string{"p.yaml:5: spec.env.extraDeviceVariables[0]", "always a device variable"}},
		{"duplicate variable", head + "spec:\n  env:\n    extraDeviceVariables: [DOCKER_RESOURCE_GPU]\n    protectedVariables:\n      - name: DOCKER_RESOURCE_GPU\n", []string{"spec.env.protectedVariables[0].name: Duplicate value"}},
		{"bad env name", head + "spec:\n  env:\n    extraDeviceVariables: [\"1GPU\"]\n", []string{"spec.env.extraDeviceVariables[0]: Invalid value"}},
		{"values without allow", head + "spec:\n  env:\n    protectedVariables:\n      - name: NVIDIA_GDS\n        allowedValues: [enabled]\n", []string{"allowOnGPUContainers: true"}},
		{"relative path", head + "spec:\n  sensitiveHostPaths: [dev]\n", []string{"spec.sensitiveHostPaths[0]", "absolute path"}},
		{"writable root", head + "spec:\n  writableHostPaths: [/]\n", []string{"spec.writableHostPaths[0]", "host's root cannot be writable"}},
		{"writable above a sensitive path", head + "spec:\n  writableHostPaths: [/var/lib]\n", []string{"spec.writableHostPaths[0]", "holds the sensitive path /var/lib/kubelet/device-plugins"}},
		{"scoped writable without a name", head + "spec:\n  writableHostPaths: [{path: /var/log, serviceAccounts: [{namespace: logging}]}]\n", []string{"spec.writableHostPaths[0].serviceAccounts[0]"}},
		{"scoped writable bad namespace", head + "spec:\n  writableHostPaths: [{path: /var/log, namespaces: [Logging]}]\n", []string{"spec.writableHostPaths[0].namespaces[0]"}},
		{"writable entry of another shape", head + "spec:\n  writableHostPaths: [{path: /var/log, owners: [x]}]\n", []string{"spec.writableHostPaths[0].owners: unknown field"}},
		{"relative runtime state", head + "spec:\n  runtimeStateHostPaths: [run]\n", []string{"spec.runtimeStateHostPaths[0]", "absolute path"}},
		{"bad severity", head + "spec:\n  advisories: {privileged: block}\n", []string{"spec.advisories.privileged: Unsupported value"}},
		{"bad exemption", head + "spec:\n  exemptions:\n    serviceAccounts: [{namespace: Team_A, name: x}]\n", []string{"spec.exemptions.serviceAccounts[0].namespace"}},
		{"bad KAI reservation namespace", head + "spec:\n  integrations:\n    kaiScheduler: {reservationNamespace: KAI_Reservations}\n", []string{"spec.integrations.kaiScheduler.reservationNamespace: Invalid value"}},
		{"empty prefix", head + "spec:\n  annotations: {deniedPrefixes: ['']}\n", []string{"would deny every annotation"}},
		{"empty ignored prefix", head + "spec:\n  annotations: {ignoredPrefixes: ['']}\n", []string{"spec.annotations.ignoredPrefixes[0]", "silence every warning"}},
		{"suspect label with a dot", head + "spec:\n  annotations: {suspectDomainLabels: [cdi.k8s]}\n", []string{"spec.annotations.suspectDomainLabels[0]", "one lower-case word"}},
		{"suspect label with a dash", head + "spec:\n  annotations: {suspectDomainLabels: [cdi-devices]}\n", []string{"spec.annotations.suspectDomainLabels[0]"}},
		{"bad capabilities severity", head + "spec:\n  advisories: {capabilities: allow}\n", []string{"spec.advisories.capabilities: Unsupported value"}},
		{"capability with CAP_", head + "spec:\n  allowedCapabilities: [CAP_CHOWN]\n", []string{"spec.allowedCapabilities[0]", "without CAP_"}},
		{"lower-case capability", head + "spec:\n  allowedCapabilities: [chown]\n", []string{"spec.allowedCapabilities[0]", "upper case"}},
		{"non-ASCII capability", head + "spec:\n  allowedCapabilities: [\"ſYS_ADMIN\"]\n", []string{"spec.allowedCapabilities[0]"}},
		{"duplicate capability", head + "spec:\n  allowedCapabilities: [CHOWN, CHOWN]\n", []string{"spec.allowedCapabilities[1]: Duplicate value"}},
		{"missing apiVersion", "kind: GPUGuardPolicy\nspec: {}\n", []string{"apiVersion: Required value"}},
		{"wrong kind", "apiVersion: gpuguard.io/v1alpha1\nkind: Policy\n", []string{"kind: Unsupported value: \"Policy\""}},
		{"two documents", head + "---\n" + head, []string{"one YAML document"}},
		{"empty", "", []string{"empty policy document"}},
		{"broken yaml", head + "spec: [\n", []string{"p.yaml:", "line"}},
		{"null switch", head + "spec:\n  injectVoid:\n", []string{"p.yaml:4: spec.injectVoid: empty value"}},
		{"null list", head + "spec:\n  sensitiveHostPaths: ~\n", []string{"p.yaml:4: spec.sensitiveHostPaths: empty value"}},
		{"duplicate key", head + "spec:\n  mode: warn\n  mode: audit\n", []string{"p.yaml:5: spec.mode: field given twice (first on line 4)"}},
		{"configmap without key", "apiVersion: v1\nkind: ConfigMap\ndata:\n  other.yaml: x\n", []string{"has no key \"policy.yaml\""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Load("p.yaml", []byte(tc.doc))
			if err == nil {
				t.Fatal("no error")
			}
			msg := err.Error()
			rest := msg
			for _, w := range tc.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("error %q lacks %q", msg, w)
				}
				rest = rest[i+len(w):]
			}
			if _, ok := config.AsError(err); !ok {
				t.Errorf("error is not a *config.Error: %T", err)
			}
		})
	}
}

func TestConfigMapLineNumbers(t *testing.T) {
	cm := "apiVersion: v1\nkind: ConfigMap\ndata:\n  policy.yaml: |\n    " + strings.ReplaceAll(head, "\n", "\n    ") + "spec:\n      mode: loud\n"
	_, err := config.Load("cm.yaml", []byte(cm))
	if err == nil || !strings.Contains(err.Error(), "cm.yaml: data[policy.yaml]:4: spec.mode") {
		t.Errorf("want the line within the policy document, got %v", err)
	}
}

func TestAdvice(t *testing.T) {
	if a := config.Advice(config.Default()); len(a) != 0 {
		t.Errorf("the default policy needs no advice, got %v", a)
	}
	p, err := config.Parse("p.yaml", []byte(head+"spec:\n  exemptions:\n    namespaces: [gpu-operator]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if a := config.Advice(p); len(a) != 1 || !strings.Contains(a[0], `namespace "gpu-operator" is exempt`) {
		t.Errorf("a whole-namespace exemption must be reported as broad, got %v", a)
	}
	p, err = config.Parse("p.yaml", []byte(head+"spec:\n  exemptions:\n    serviceAccounts:\n"+
		"    - {namespace: infra, name: all-rules}\n    - {namespace: infra, name: some, rules: [privileged]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if a := config.Advice(p); len(a) != 1 || !strings.Contains(a[0], "infra/all-rules is exempt from every rule") {
		t.Errorf("a service account exempt from every rule must be reported as broad, and one naming its rules not, got %v", a)
	}
	if _, err := config.Parse("p.yaml", []byte(head+"spec:\n  exemptions:\n    serviceAccounts:\n    - {namespace: infra, name: a, rules: [\"\"]}\n")); err == nil ||
		!strings.Contains(err.Error(), "spec.exemptions.serviceAccounts[0].rules[0]") {
		t.Errorf("an empty rule ID must be refused with its field, got %v", err)
	}
}

// TestSpecJSONSchemaCoversEveryField: the schema has every field of the spec,
// refuses unknown ones at every level, and knows each enumeration.
func TestSpecJSONSchemaCoversEveryField(t *testing.T) {
	s := config.SpecJSONSchema()
	props := s["properties"].(map[string]any)
	if len(props) != reflect.TypeFor[config.PolicySpec]().NumField() || s["additionalProperties"] != false {
		t.Fatalf("spec schema has %d properties for %d fields", len(props), reflect.TypeFor[config.PolicySpec]().NumField())
	}
	if mode := props["mode"].(map[string]any); !reflect.DeepEqual(mode["enum"], config.Modes) {
		t.Errorf("mode enum %v", mode["enum"])
	}
	sa := props["exemptions"].(map[string]any)["properties"].(map[string]any)["serviceAccounts"].(map[string]any)["items"].(map[string]any)
	if !reflect.DeepEqual(sa["required"], []string{"namespace", "name"}) || sa["additionalProperties"] != false {
		t.Errorf("service account entries: %v", sa)
	}
}

// TestWritableHostPathForms: an entry of writableHostPaths is a plain path or
// a scoped entry, and a plain one is written back as its path.
func TestWritableHostPathForms(t *testing.T) {
	p, err := config.Parse("p.yaml", []byte("apiVersion: gpuguard.io/v1alpha1\nkind: GPUGuardPolicy\nspec:\n  writableHostPaths:\n"+
		"    - /var/tmp\n    - {path: /var/log, serviceAccounts: [{namespace: logging, name: fluent-bit}]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	w := p.Spec.WritableHostPaths
	if len(w) != 2 || w[0].Scoped() || w[0].Path != "/var/tmp" || !w[1].Scoped() {
		t.Fatalf("entries %+v", w)
	}
	if !w[1].Admits("logging", "fluent-bit") || w[1].Admits("logging", "other") || !w[0].Admits("team-a", "default") {
		t.Errorf("scopes wrong: %+v", w)
	}
	out, err := json.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	if want := `["/var/tmp",{"path":"/var/log","serviceAccounts":[{"namespace":"logging","name":"fluent-bit"}]}]`; string(out) != want {
		t.Errorf("marshalled %s, want %s", out, want)
	}
}
