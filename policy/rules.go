package policy

// RuleID names a rule in violations, warnings, audit annotations and metrics.
// Each rule declares its ID in its check_<rule>.go file and registers itself
// there (registry.go).
type RuleID string
