package suggest

import (
	"path"
	"regexp"
	"strings"
	"unicode"
)

// Shapes of strings. A path or an id seen once says little about the next
// one: /tmp/job-4711.log will be /tmp/job-4712.log, a session id is new
// every time. So a value without spaces is cut into tokens (runs of
// letters and digits between other characters) and the tokens that look
// like what changes from run to run become "*": numbers, and long tokens
// with digits or in the capitals random ids are made of. What is left is
// the value's shape, a glob (path.Match syntax: "*" stays within one
// "/"-separated name). Text with spaces (a shell command) is free text: its
// shape is itself.

// volatile reports whether tok, a run of letters and digits, looks like a
// value that changes between calls: a number, a token of 8 or more with a
// digit (a hex id), or one of 16 or more without small letters (the
// capitals and digits of rand.Text).
func volatile(tok string) bool {
	digits, upper, lower := 0, 0, 0
	for _, r := range tok {
		switch {
		case r >= '0' && r <= '9':
			digits++
		case unicode.IsUpper(r):
			upper++
		default:
			lower++
		}
	}
	n := len(tok)
	return digits == n || (n >= 8 && digits > 0) || (n >= 16 && lower == 0)
}

func isTokenRune(r rune) bool {
	return r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z'
}

// hasSpace reports whether s is free text (holds white space).
func hasSpace(s string) bool { return strings.IndexFunc(s, unicode.IsSpace) >= 0 }

// stable reports whether s is a value a set of literals can hold: free
// text, or a value with no volatile token.
func stable(s string) bool {
	if hasSpace(s) {
		return true
	}
	for _, tok := range strings.FieldsFunc(s, func(r rune) bool { return !isTokenRune(r) }) {
		if volatile(tok) {
			return false
		}
	}
	return true
}

// globShape is the shape of s as a glob: volatile tokens as "*", the
// characters a glob gives a meaning to escaped. Free text is itself.
func globShape(s string) string {
	var b strings.Builder
	free := hasSpace(s)
	for i := 0; i < len(s); {
		r := rune(s[i])
		if !free && isTokenRune(r) {
			j := i
			for j < len(s) && isTokenRune(rune(s[j])) {
				j++
			}
			if volatile(s[i:j]) {
				b.WriteByte('*')
			} else {
				b.WriteString(s[i:j])
			}
			i = j
			continue
		}
		if strings.IndexByte(`*?[\`, s[i]) >= 0 {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
		i++
	}
	return b.String()
}

// dirShape is a coarser shape of a path: its last name as "*"
// ("/var/log/a.log" → "/var/log/*"); "" for a value that is no path.
func dirShape(s string) string {
	if hasSpace(s) || !strings.HasPrefix(s, "/") {
		return ""
	}
	dir := path.Dir(globShape(s))
	if dir == "/" {
		return "/*"
	}
	return dir + "/*"
}

// trivial reports whether a shape says nothing but the number of names
// ("*", "*/*"): every value of that depth fits it.
func trivial(glob string) bool {
	return strings.Trim(glob, "*/") == "" && !strings.HasPrefix(glob, "/")
}

// globRegex is the RE2 form of a glob made by globShape: "*" is "[^/]*",
// escaped characters are themselves.
func globRegex(glob string) string {
	var b strings.Builder
	for i := 0; i < len(glob); i++ {
		switch c := glob[i]; c {
		case '*':
			b.WriteString("[^/]*")
		case '\\':
			i++
			if i < len(glob) {
				b.WriteString(regexp.QuoteMeta(glob[i : i+1]))
			}
		default:
			b.WriteString(regexp.QuoteMeta(glob[i : i+1]))
		}
	}
	return b.String()
}
