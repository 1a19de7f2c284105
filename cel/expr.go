package cel

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// str is a CEL string literal.
func str(s string) string { return strconv.Quote(s) }

// list is a CEL list of string literals.
func list(items []string) string {
	quoted := make([]string, len(items))
	for i, s := range items {
		quoted[i] = str(s)
	}
	return "[" + strings.Join(quoted, ", ") + "]"
}

// or joins alternatives; an empty set is false.
func or(alts ...string) string {
	var kept []string
	for _, a := range alts {
		if a != "" && a != "false" {
			kept = append(kept, "("+a+")")
		}
	}
	if len(kept) == 0 {
		return "false"
	}
	return strings.Join(kept, " || ")
}

// globToRegexp turns a gpuResources pattern into an anchored regular expression
// with path.Match's meaning of * and ?, which never match a slash. Character
// classes are refused: CEL's RE2 and path.Match differ in their details.
func globToRegexp(glob string) (string, error) {
	if strings.ContainsAny(glob, "[\\") {
		return "", fmt.Errorf("pattern %q: character classes and escapes cannot be rendered for CEL exactly", glob)
	}
	var b strings.Builder
	b.WriteString("^")
	for _, r := range glob {
		switch r {
		case '*':
			b.WriteString("[^/]*")
		case '?':
			b.WriteString("[^/]")
		default:
			b.WriteString(regexp.QuoteMeta(string(r)))
		}
	}
	b.WriteString("$")
	return b.String(), nil
}

// cleanPath is a path as the webhook compares it, for paths that need no cleaning:
// rooted, without one trailing slash. judgeable says whether CEL can compare a path
// exactly: one with "//" or a "." segment needs path.Clean, which CEL lacks, and is
// left to the webhook rather than judged wrongly.
func cleanPath(p string) string {
	rooted := fmt.Sprintf(`(%[1]s.startsWith("/") ? %[1]s : "/" + %[1]s)`, p)
	return fmt.Sprintf(`(%[1]s.size() > 1 && %[1]s.endsWith("/") ? %[1]s.substring(0, %[1]s.size() - 1) : %[1]s)`, rooted)
}

func judgeable(p string) string {
	return fmt.Sprintf(`!%[1]s.contains("//") && !%[1]s.contains("/.") && !%[1]s.startsWith(".")`, p)
}
