package policy

// RuleID names a rule in violations, warnings, audit annotations and metrics.
type RuleID string

// The rules, one per check_*.go file.
const (
	RuleDeviceEnv          RuleID = "device-env"
	RuleProtectedEnv       RuleID = "protected-env"
	RuleEnvValueFrom       RuleID = "env-value-from"
	RuleEnvFromPrefix      RuleID = "envfrom-prefix"
	RuleEnvFromUnprefixed  RuleID = "envfrom-unprefixed"
	RuleDeviceListMount    RuleID = "device-list-mount"
	RuleDeviceAnnotation   RuleID = "device-annotation"
	RuleInjectorAnnotation RuleID = "injector-annotation"
	RuleSensitiveHostPath  RuleID = "sensitive-hostpath"
	RuleNVIDIARuntimeClass RuleID = "nvidia-runtime-class"
	RulePrivileged         RuleID = "privileged"
	RuleCapabilities       RuleID = "capabilities"
	RuleInjectVoid         RuleID = "inject-void"
	RuleFinalState         RuleID = "final-state"
	RuleNamespaceMode      RuleID = "namespace-mode"
)

// Rules lists every rule ID, for documentation and metrics.
var Rules = []RuleID{
	RuleDeviceEnv, RuleProtectedEnv, RuleEnvValueFrom, RuleEnvFromPrefix, RuleEnvFromUnprefixed,
	RuleDeviceListMount, RuleDeviceAnnotation, RuleInjectorAnnotation, RuleSensitiveHostPath, RuleNVIDIARuntimeClass,
	RulePrivileged, RuleCapabilities, RuleInjectVoid, RuleFinalState, RuleNamespaceMode,
}
