package policy

import (
	"regexp"
)

// checkCapabilityName is the rule capability-name: capability names that the
// runtime and the API server's CEL would read differently.
//
// Fields read, in every container kind:
//   - securityContext.capabilities.add.
//
// Allowed values: names of ASCII letters, digits and underscores. The
// runtime upper-cases a capability name with Unicode rules (Go's
// strings.ToUpper turns ſ, U+017F, into S, so ſys_admin is CAP_SYS_ADMIN),
// while the backstop and the webhooks' pre-filter can only fold ASCII
// (upperAscii): such a name would pass the pre-filter and the backstop as
// unknown and reach the runtime as SYS_ADMIN. Refusing what is not plain
// ASCII makes both paths read the same names. Dropped names need no rule:
// a name the checks do not recognise in drop only makes them stricter.
// Default action: deny, whatever the action.
func checkCapabilityName(_ *Input, c *containerRef) []Finding {
	sc := c.c.SecurityContext
	if sc == nil || sc.Capabilities == nil {
		return nil
	}
	for i, a := range sc.Capabilities.Add {
		if !plainCapabilityName.MatchString(string(a)) {
			return []Finding{containerFinding(RuleCapabilityName, effectDeny, c,
				c.path().Child("securityContext", "capabilities", "add").Index(i).String(),
				"adds %q, a capability name with characters outside ASCII letters, digits and _: the runtime folds its case with Unicode rules, "+
					"the API server with ASCII ones, so the two would read different capabilities; write it in plain ASCII", string(a))}
		}
	}
	return nil
}

// plainCapabilityNamePattern is the one text of the engine's and the CEL's
// test (RE2).
const plainCapabilityNamePattern = `^[A-Za-z0-9_]+$`

var plainCapabilityName = regexp.MustCompile(plainCapabilityNamePattern)

// odd capability names in a container c's added capabilities.
var oddCapabilityNameCEL = `has(c.securityContext) && has(c.securityContext.capabilities) && has(c.securityContext.capabilities.add) && ` +
	`c.securityContext.capabilities.add.exists(a, !a.matches('` + plainCapabilityNamePattern + `'))`

// RuleCapabilityName is the rule of checkCapabilityName.
const RuleCapabilityName RuleID = "capability-name"

func init() {
	register(&Rule{
		ID:      RuleCapabilityName,
		Summary: "an added capability whose name is not plain ASCII, which the runtime and CEL would fold differently (deny)",
		Order:   175, ContainerCheck: checkCapabilityName,
		Trigger: func(in *CELInput) *CELTrigger { return &CELTrigger{Container: oddCapabilityNameCEL} },
		CEL: func(in *CELInput) *CELCheck {
			return &CELCheck{Plain: oddCapabilityNameCEL, GPU: oddCapabilityNameCEL,
				Message: "adds a capability whose name is not plain ASCII; the runtime would fold it differently from the API server"}
		},
	})
}
