package policy

// RuleNamespaceMode is not a check: the engine reports under it, as a
// warning on the object, that the namespace's gpuguard.io/mode label changed
// the mode the policy applies (see ModeFor). It is registered so that it is
// documented and counted like the rules.
const RuleNamespaceMode RuleID = "namespace-mode"

func init() {
	register(&Rule{
		ID:      RuleNamespaceMode,
		Summary: "(warning) the namespace's `gpuguard.io/mode` label changed the mode, where `namespaceModeOverride` lets it",
		Order:   1,
		Gap: "the `gpuguard.io/mode` namespace label: namespaces whose label relaxes the mode are left out of the validating binding " +
			"(the webhook alone judges them), and a label that tightens it is not honoured (the binding applies the policy's own mode)",
	})
}
