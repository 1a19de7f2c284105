package policy

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Every message of a finding is one sentence in two clauses, "what; fix":
// what is wrong with the field, then what to do about it. The field and the
// container are not repeated in it, since the finding's path names both.
// Values a user chose are shown through quote, so that a message stays short
// whatever the object holds.

// MaxWarning is the longest admission warning gpuguard returns: kubectl
// prints each on one line after "Warning: ".
const MaxWarning = 120

// String is the warning as an admission warning, "gpuguard RULE: PATH: what;
// fix", at most MaxWarning bytes. Where that does not fit (a controller's
// long template path, a long annotation key), it gives up, in turn, the
// template part of the path, the "what" clause, and the middle of the path;
// the fix is always kept whole, and no clause is ever cut.
func (w Warning) String() string {
	head := "gpuguard " + string(w.Rule) + ": "
	fix := fixClause(w.Message)
	local := localPath(w.Path)
	for _, c := range [][2]string{{w.Path, w.Message}, {local, w.Message}, {w.Path, fix}, {local, fix}} {
		if s := joinWarning(head, c[0], c[1]); len(s) <= MaxWarning {
			return s
		}
	}
	room := MaxWarning - len(head) - len(": ") - len(fix)
	if room < len("…x]") {
		return joinWarning(head, "", fix)
	}
	return joinWarning(head, elide(local, room), fix)
}

func joinWarning(head, path, msg string) string {
	if path == "" {
		return head + msg
	}
	return head + path + ": " + msg
}

// fixClause is the last clause of a message: what to do.
func fixClause(msg string) string {
	if i := strings.LastIndex(msg, "; "); i >= 0 {
		return msg[i+2:]
	}
	return msg
}

// whatClause is a message without its fix.
func whatClause(msg string) string {
	if i := strings.LastIndex(msg, "; "); i >= 0 {
		return msg[:i]
	}
	return msg
}

// localPath is a path inside a controller's pod template given from the
// template's pod spec on ("…spec.containers[0].env[1]"), which still names
// the container and the field.
func localPath(path string) string {
	i := strings.LastIndex(path, "template.spec.")
	if i < 0 {
		return path
	}
	return "…" + path[i+len("template."):]
}

// elide shortens s to at most n bytes by cutting out its middle, on rune
// boundaries.
func elide(s string, n int) string {
	if len(s) <= n {
		return s
	}
	keep := n - len("…")
	head, tail := keep/2, keep-keep/2
	for head > 0 && !utf8.RuneStart(s[head]) {
		head--
	}
	start := len(s) - tail
	for start < len(s) && !utf8.RuneStart(s[start]) {
		start++
	}
	return s[:head] + "…" + s[start:]
}

// String is the violation as one line of a denial: "PATH [RULE]: message",
// with the container's name where the finding is about one.
func (v Violation) String() string {
	if v.Container == "" {
		return fmt.Sprintf("%s [%s]: %s", v.Path, v.Rule, v.Message)
	}
	return fmt.Sprintf("%s (container %s) [%s]: %s", v.Path, quote(v.Container), v.Rule, v.Message)
}

// quote shows a user-supplied value in a message, shortened so that messages stay
// on one readable line.
func quote(s string) string {
	const max = 24
	if len(s) > max {
		cut := max
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return strconv.Quote(s)
}
