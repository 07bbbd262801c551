package argview

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The one-line view, for a reader that shows a value as plain text in a
// place vmgate does not control, such as the message of an MCP
// elicitation that the agent's own client shows its user. Nothing in a
// value may hide another part of it there, so on top of Escape:
//
//   - a newline is shown as \n, a tab as \t, a carriage return and the
//     other control characters as Escape shows them: a value is one line;
//   - a space other than U+0020 (no-break, em, ideographic, …) is shown as
//     \u{…}: what looks like a blank is one;
//   - a run of MinSpaceRun spaces or more is shown as ⟦N spaces⟧, so no run
//     of blanks can push what follows it out of sight; the brackets ⟦ and
//     ⟧ of a value itself are shown as \u{27e6} and \u{27e7}, so a marker
//     is always the renderer's.

// MinSpaceRun is the shortest run of spaces Inline folds into a marker.
const MinSpaceRun = 3

// Inline returns s on one line as described above, and how many escapes
// and markers it holds.
func Inline(s string) (string, int) {
	var b strings.Builder
	n := 0
	for i := 0; i < len(s); {
		if run := spaces(s[i:]); run >= MinSpaceRun {
			fmt.Fprintf(&b, "⟦%d spaces⟧", run)
			n++
			i += run
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		escaped := true
		switch {
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '⟦' || r == '⟧' || r != ' ' && unicode.Is(unicode.Zs, r):
			fmt.Fprintf(&b, `\u{%04x}`, r)
		default:
			size, escaped = escapeRune(&b, s[i:])
		}
		if escaped {
			n++
		}
		i += size
	}
	return b.String(), n
}

// spaces counts the U+0020 at the start of s.
func spaces(s string) int {
	n := 0
	for n < len(s) && s[n] == ' ' {
		n++
	}
	return n
}

// hexLine shows b as its bytes in hex, space-separated, on one line.
func hexLine(b []byte) string {
	var sb strings.Builder
	for i, c := range b {
		if i > 0 {
			sb.WriteByte(' ')
		}
		fmt.Fprintf(&sb, "%02x", c)
	}
	return sb.String()
}
