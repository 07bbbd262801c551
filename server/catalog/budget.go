package catalog

import (
	"fmt"
	"unicode/utf8"
)

// Results that carry data are bounded by the message limit
// (Limits.MaxMessageBytes, 8 MiB by default), the same bound the
// server puts on what it reads: the official MCP SDK's stdio client drops
// its connection on a message over 10 MiB (its read buffer's default), so
// a result over the limit would not arrive at all. A ranged read that would
// not fit comes back shorter, truncated, saying where to read on; an
// archive that would not fit is refused, saying how to take it in parts.

// resultSlack is what a result holds besides its data: the JSON-RPC and
// tools/call envelope, the structured fields, the short text.
const resultSlack = 64 << 10

// ResultBudget is the most data bytes one result's encoding may take.
func (l Limits) ResultBudget() int64 {
	return max(int64(l.MaxMessageBytes)-resultSlack, 4<<10)
}

// RawBudget is the most raw bytes whose base64 fits one result.
func (l Limits) RawBudget() int64 { return l.ResultBudget() / 4 * 3 }

// jsonCost is how many bytes r takes in a JSON string as encoding/json
// writes it (HTML characters and line separators escaped as \uXXXX).
func jsonCost(r rune) int64 {
	switch {
	case r == '"' || r == '\\' || r == '\n' || r == '\r' || r == '\t':
		return 2
	case r < 0x20 || r == '<' || r == '>' || r == '&' || r == '\u2028' || r == '\u2029':
		return 6
	}
	return int64(utf8.RuneLen(r))
}

// TextFits is how many bytes of text (valid UTF-8) fit budget when the
// result carries them copies times (a text read is both the result's text
// and its structured content): all of it, or a prefix ending on a whole
// character.
func TextFits(text []byte, copies, budget int64) int {
	var cost int64
	for i, r := range string(text) {
		cost += copies * jsonCost(r)
		if cost > budget {
			return i
		}
	}
	return len(text)
}

// ReadOnNote says why a read stopped short of what was asked, and where
// to read on.
func (l Limits) ReadOnNote(next int64) string {
	return fmt.Sprintf("one result carries at most %d bytes (the message limit); read on with offset %d", l.MaxMessageBytes, next)
}

// TarTooLarge refuses an archive of p that one result would not carry,
// saying how to take it in parts (err, the full detail, goes to the audit).
func (l Limits) TarTooLarge(p string, gz bool, err error) Result {
	how := "archive its subdirectories one at a time (vm_dir_list shows them and their sizes)"
	if !gz {
		how += ", or ask with gzip: true"
	}
	msg := fmt.Sprintf("the tar of %s is more than one result carries (%d bytes of tar, base64 in a message of at most %d bytes): %s", p, l.RawBudget(), l.MaxMessageBytes, how)
	r := Failure(TagInvalid, msg, true)
	r.Detail = msg + ": " + err.Error()
	return r
}
