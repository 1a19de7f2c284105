// Package policy is gpuguard's decision engine: given everything the API server knows
// about an admission request and a policy document, it decides whether the object is
// allowed, what is wrong with it, and the RFC 6902 patch the mutating phase applies.
//
// The engine is pure: it reads Kubernetes API types only and talks to no cluster. The
// webhook and the offline `gpuguard check` command both call Evaluate, so they cannot
// disagree. One rule lives in each check_*.go file, whose doc comment lists the fields
// it reads and the values it allows.
package policy
