package main

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// readmeBlock is a fenced block of README.md: its info string ("sh", or ""
// for output), its lines, and the walkthrough it belongs to, from a
// `<!-- walkthrough: NAME ... -->` line just above it.
type readmeBlock struct {
	info, walkthrough string
	lines             []string
}

func (b readmeBlock) text() string { return strings.Join(b.lines, "\n") }

var walkthroughMarker = regexp.MustCompile(`^<!-- walkthrough: ([a-z-]+) \(run by e2e/cluster\) -->$`)

func readREADME(t *testing.T) []readmeBlock {
	t.Helper()
	f, err := os.Open("README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var blocks []readmeBlock
	var cur *readmeBlock
	marked := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case cur == nil && strings.HasPrefix(line, "```"):
			cur = &readmeBlock{info: strings.TrimPrefix(line, "```"), walkthrough: marked}
		case cur != nil && line == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.lines = append(cur.lines, line)
		}
		marked = ""
		if m := walkthroughMarker.FindStringSubmatch(line); m != nil {
			marked = m[1]
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return blocks
}

// The README's two shell blocks outside the walkthrough, as this package
// knows them: an edit to either must come with its test here.
const (
	// Run by CI (make test) and by make test (hack/test.sh's demo step).
	readmeQuickStart = "make demo    # a local kube-apiserver with gpuguard installed; applies examples/ through it\n" +
		"make test    # every test: lint, unit, CLI, a bounded fuzz run, the images and the end-to-end suites"
	// Run by TestREADMECheckExample.
	readmeCheck = "make build && export PATH=$PWD/bin:$PATH\ngpuguard check examples/"
)

// TestEveryREADMECommandIsRun: each shell block of the README is a
// walkthrough block, which e2e/cluster runs verbatim (and fails on one it
// does not know), or one of the two above, each run as said there.
func TestEveryREADMECommandIsRun(t *testing.T) {
	walkthroughs := 0
	for _, b := range readREADME(t) {
		switch {
		case b.info != "sh":
		case b.walkthrough != "":
			walkthroughs++
		case b.text() == readmeQuickStart, b.text() == readmeCheck:
		default:
			t.Errorf("README shell block is run by no test: mark it <!-- walkthrough: NAME (run by e2e/cluster) --> "+
				"and add it to e2e/cluster/walkthrough_test.go, or run it here:\n%s", b.text())
		}
	}
	if walkthroughs == 0 {
		t.Error("README has no walkthrough block")
	}
	script, err := os.ReadFile("hack/test.sh")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^step demo$`).Match(script) {
		t.Error("hack/test.sh does not run make demo, which the README's quick start names")
	}
}

// TestREADMECheckExample runs the README's offline block verbatim (make
// build included) and finds each entry of the output the README shows, whole,
// among the entries it prints: the README shows what gpuguard says, if not
// all of it.
func TestREADMECheckExample(t *testing.T) {
	if testing.Short() {
		t.Skip("builds both binaries with make")
	}
	blocks := readREADME(t)
	var shown string
	for i, b := range blocks {
		if b.info == "sh" && b.text() == readmeCheck && i+1 < len(blocks) && blocks[i+1].info == "" {
			shown = blocks[i+1].text()
		}
	}
	if shown == "" {
		t.Fatal("README has no check block followed by its output")
	}
	cmd := exec.Command("bash", "-c", readmeCheck)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("want exit 1 (the examples include denied objects), got %v:\n%s", err, out)
	}
	printed := entries(string(out))
	for _, entry := range entries(shown) {
		if !slices.Contains(printed, entry) {
			t.Errorf("the README shows\n%s\nwhich gpuguard check examples/ does not print:\n%s", entry, out)
		}
	}
}

// entries splits check output into its entries: a verdict line and the
// indented lines under it.
func entries(output string) []string {
	var list []string
	for _, line := range strings.Split(output, "\n") {
		if strings.HasPrefix(line, " ") && len(list) > 0 {
			list[len(list)-1] += "\n" + line
			continue
		}
		list = append(list, line)
	}
	return list
}

// TestREADMEIsAFrontDoor: the README stays short enough to read first;
// reference belongs in docs/.
func TestREADMEIsAFrontDoor(t *testing.T) {
	text, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(text), "\n"); n > 250 {
		t.Errorf("README.md has %d lines, at most 250: move reference to docs/ (docs/README.md indexes it)", n)
	}
}
