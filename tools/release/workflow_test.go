package release

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	sigsyaml "sigs.k8s.io/yaml"
)

// The release workflow runs on GitHub only, never in this repository's CI:
// what can be checked here is what it asks for. These tests hold it to that
// (docs/release.md, "Releasing a tag").

const releaseWorkflow = ".github/workflows/release.yaml"

// ghWorkflow is the part of a GitHub Actions workflow the checks read.
type ghWorkflow struct {
	Permissions json.RawMessage  `json:"permissions"`
	Jobs        map[string]ghJob `json:"jobs"`
}

type ghJob struct {
	Permissions json.RawMessage `json:"permissions"`
	// Uses is a reusable workflow that the job calls.
	Uses  string   `json:"uses"`
	Steps []ghStep `json:"steps"`
}

type ghStep struct {
	Name string `json:"name"`
	Uses string `json:"uses"`
	Run  string `json:"run"`
}

var (
	// pinnedByCommit is an action reference by full commit SHA.
	pinnedByCommit = regexp.MustCompile(`@[0-9a-f]{40}$`)
	// buildsRelease is a run: that builds what is released.
	buildsRelease = regexp.MustCompile(`\bmake\s+(?:[^\n]*\s)?(?:push|dist|images)\b|hack/release\b`)
	// signs is a run: that signs or attests with cosign.
	signs = regexp.MustCompile(`\bcosign\s+(?:sign|sign-blob|attest|attest-blob)\b`)
	// signingAction is an action that signs or attests.
	signingAction = regexp.MustCompile(`^actions/(?:attest|attest-build-provenance|attest-sbom)@`)
)

// tokenScopes are the GITHUB_TOKEN's permission scopes, which read-all and
// write-all grant at once.
var tokenScopes = []string{"actions", "attestations", "checks", "contents", "deployments", "discussions",
	"id-token", "issues", "models", "packages", "pages", "pull-requests", "security-events", "statuses"}

// parsePermissions reads a permissions: value: a map of scope to read,
// write or none, or read-all or write-all. set is false where there is no
// permissions: key at all (the token then gets the repository's default).
func parsePermissions(raw json.RawMessage) (perms map[string]string, set bool, err error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, false, nil
	}
	var all string
	if json.Unmarshal(raw, &all) == nil {
		level, ok := map[string]string{"read-all": "read", "write-all": "write"}[all]
		if !ok {
			return nil, true, fmt.Errorf("permissions %q: want read-all, write-all or a map", all)
		}
		perms = map[string]string{}
		for _, s := range tokenScopes {
			perms[s] = level
		}
		return perms, true, nil
	}
	if err := json.Unmarshal(raw, &perms); err != nil {
		return nil, true, fmt.Errorf("permissions %s: %w", raw, err)
	}
	if perms == nil {
		perms = map[string]string{}
	}
	return perms, true, nil
}

// checkWorkflow lists what breaks the release workflow's rules:
//   - every action, in any step or job, is pinned by a full commit SHA;
//   - the workflow-wide permissions grant nothing beyond contents: read;
//   - id-token: write (an OIDC token, hence a signing identity) is granted
//     only to jobs that sign or attest;
//   - no job that builds (make push, make dist, make images, hack/release)
//     has id-token: write.
func checkWorkflow(w ghWorkflow) []string {
	var problems []string
	top, set, err := parsePermissions(w.Permissions)
	switch {
	case err != nil:
		problems = append(problems, "workflow: "+err.Error())
	case !set:
		problems = append(problems, "workflow: no top-level permissions: every job without its own gets the repository's default token")
	}
	var granted []string
	for scope, level := range top {
		if level != "none" && (scope != "contents" || level != "read") {
			granted = append(granted, scope+": "+level)
		}
	}
	if len(granted) > 0 {
		slices.Sort(granted)
		problems = append(problems, fmt.Sprintf("workflow: top-level permissions grant %s; want nothing beyond contents: read", strings.Join(granted, ", ")))
	}
	names := make([]string, 0, len(w.Jobs))
	for name := range w.Jobs {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		job := w.Jobs[name]
		if job.Uses != "" && !pinnedByCommit.MatchString(job.Uses) {
			problems = append(problems, fmt.Sprintf("job %s: uses %s: not pinned by a full commit SHA", name, job.Uses))
		}
		perms, set, err := parsePermissions(job.Permissions)
		if err != nil {
			problems = append(problems, fmt.Sprintf("job %s: %v", name, err))
		}
		if !set {
			perms = top
		}
		idToken := perms["id-token"] == "write"
		var signer bool
		for i, step := range job.Steps {
			label := fmt.Sprintf("job %s, step %d", name, i+1)
			if step.Name != "" {
				label += fmt.Sprintf(" (%s)", step.Name)
			}
			if step.Uses != "" && !strings.HasPrefix(step.Uses, "./") && !pinnedByCommit.MatchString(step.Uses) {
				problems = append(problems, fmt.Sprintf("%s: uses %s: not pinned by a full commit SHA", label, step.Uses))
			}
			run := commands(step.Run)
			if signs.MatchString(run) || signingAction.MatchString(step.Uses) {
				signer = true
			}
			if idToken && buildsRelease.MatchString(run) {
				problems = append(problems, fmt.Sprintf("%s: builds (%s) in a job with id-token: write: build and sign in separate jobs",
					label, buildsRelease.FindString(run)))
			}
		}
		if idToken && !signer {
			problems = append(problems, fmt.Sprintf("job %s: id-token: write, but it neither signs nor attests", name))
		}
	}
	return problems
}

// commands is a run: script without its comment lines, which neither build
// nor sign.
func commands(run string) string {
	var kept []string
	for _, line := range strings.Split(run, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			kept = append(kept, line)
		}
	}
	return strings.Join(kept, "\n")
}

func readWorkflow(t *testing.T, data []byte) ghWorkflow {
	t.Helper()
	var w ghWorkflow
	if err := sigsyaml.Unmarshal(data, &w); err != nil {
		t.Fatal(err)
	}
	return w
}

// TestReleaseWorkflow holds .github/workflows/release.yaml to the rules of
// checkWorkflow, and checks that it still has the jobs the rules are about:
// one pushing the images, one building the archives, and one signing.
func TestReleaseWorkflow(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot(t), filepath.FromSlash(releaseWorkflow)))
	if err != nil {
		t.Fatal(err)
	}
	w := readWorkflow(t, data)
	for _, p := range checkWorkflow(w) {
		t.Errorf("%s: %s", releaseWorkflow, p)
	}
	has := map[string]bool{}
	for _, job := range w.Jobs {
		for _, step := range job.Steps {
			for what, re := range map[string]*regexp.Regexp{
				"make push":                     regexp.MustCompile(`\bmake push\b`),
				"make dist":                     regexp.MustCompile(`\bmake dist\b`),
				"cosign sign":                   regexp.MustCompile(`\bcosign sign\b`),
				"cosign attest --type spdxjson": regexp.MustCompile(`\bcosign attest\b.*--type spdxjson`),
				"cosign sign-blob":              regexp.MustCompile(`\bcosign sign-blob\b`),
			} {
				if re.MatchString(commands(step.Run)) {
					has[what] = true
				}
			}
		}
	}
	for _, what := range []string{"make push", "make dist", "cosign sign", "cosign attest --type spdxjson", "cosign sign-blob"} {
		if !has[what] {
			t.Errorf("%s: no step runs %s", releaseWorkflow, what)
		}
	}
}

// TestReleaseWorkflowRulesFail: each rule of checkWorkflow reports a
// workflow that breaks it, naming the job and step.
func TestReleaseWorkflowRulesFail(t *testing.T) {
	const sign = `
  sign:
    permissions: {id-token: write, packages: write}
    steps:
      - run: cosign sign --yes img@sha256:0`
	const checkout = "actions/checkout@3d3c42e5aac5ba805825da76410c181273ba90b1"
	for _, tc := range []struct {
		name, yaml string
		want       []string // substrings of one problem each; none: no problem
	}{
		{"good", "permissions: {}\njobs:\n  build:\n    permissions: {contents: read}\n    steps:\n      - uses: " + checkout + "\n      - run: make push" + sign, nil},
		{"comments neither build nor sign", "permissions: {}\njobs:\n  sign:\n    permissions: {id-token: write}\n    steps:\n      - run: |\n          # what make push pushed\n          cosign sign --yes x", nil},
		{"contents read at the top", "permissions: {contents: read}\njobs:" + sign, nil},
		{"step pinned by tag", "permissions: {}\njobs:\n  build:\n    steps:\n      - name: Check out\n        uses: actions/checkout@v4" + sign,
			[]string{"job build, step 1 (Check out): uses actions/checkout@v4: not pinned"}},
		{"step pinned by a short SHA", "permissions: {}\njobs:\n  build:\n    steps:\n      - uses: actions/checkout@3d3c42e" + sign,
			[]string{"job build, step 1: uses actions/checkout@3d3c42e: not pinned"}},
		{"reusable workflow by branch", "permissions: {}\njobs:\n  call:\n    uses: org/repo/.github/workflows/x.yaml@main" + sign,
			[]string{"job call: uses org/repo/.github/workflows/x.yaml@main: not pinned"}},
		{"no top-level permissions", "jobs:" + sign, []string{"workflow: no top-level permissions"}},
		{"write at the top", "permissions: {contents: read, packages: write}\njobs:" + sign,
			[]string{"workflow: top-level permissions grant packages: write"}},
		{"id-token at the top", "permissions: {id-token: write}\njobs:\n  build:\n    steps:\n      - run: echo" + sign,
			[]string{"workflow: top-level permissions grant id-token: write", "job build: id-token: write, but it neither signs"}},
		{"read-all at the top", "permissions: read-all\njobs:" + sign, []string{"workflow: top-level permissions grant actions: read"}},
		{"id-token where nothing is signed", "permissions: {}\njobs:\n  build:\n    permissions: {id-token: write}\n    steps:\n      - run: echo" + sign,
			[]string{"job build: id-token: write, but it neither signs nor attests"}},
		{"builds and signs in one job", "permissions: {}\njobs:\n  release:\n    permissions: {id-token: write}\n    steps:\n      - name: Build\n        run: make push REGISTRY=r\n      - run: make dist\n      - run: cosign sign --yes x",
			[]string{"job release, step 1 (Build): builds (make push) in a job with id-token: write", "job release, step 2: builds (make dist)"}},
		{"builds with write-all", "permissions: {}\njobs:\n  release:\n    permissions: write-all\n    steps:\n      - run: |\n          make images\n          cosign sign --yes x",
			[]string{"job release, step 1: builds (make images) in a job with id-token: write"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := checkWorkflow(readWorkflow(t, []byte(tc.yaml)))
			if len(got) != len(tc.want) {
				t.Fatalf("problems %q, want %d: %q", got, len(tc.want), tc.want)
			}
			for _, want := range tc.want {
				if !slices.ContainsFunc(got, func(p string) bool { return strings.Contains(p, want) }) {
					t.Errorf("no problem says %q: %q", want, got)
				}
			}
		})
	}
}
