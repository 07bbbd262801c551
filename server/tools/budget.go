package tools

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/internal/guestctl"
	"github.com/vmgate/vmgate/server/catalog"
)

// Results that carry data are bounded by the message limit
// (catalog.Limits.MaxMessageBytes, 8 MiB by default), the same bound the
// server puts on what it reads: the official MCP SDK's stdio client drops
// its connection on a message over 10 MiB (its read buffer's default), so
// a result over the limit would not arrive at all. A ranged read that would
// not fit comes back shorter, truncated, saying where to read on; an
// archive that would not fit is refused, saying how to take it in parts.

// resultSlack is what a result holds besides its data: the JSON-RPC and
// tools/call envelope, the structured fields, the short text.
const resultSlack = 64 << 10

// resultBudget is the most data bytes one result's encoding may take.
func resultBudget(e *catalog.Env) int64 {
	return max(int64(e.Limits.MaxMessageBytes)-resultSlack, 4<<10)
}

// base64Budget is the most raw bytes whose base64 fits budget bytes.
func base64Budget(budget int64) int64 { return budget / 4 * 3 }

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

// textFits is how many bytes of text (valid UTF-8) fit budget when the
// result carries them copies times (a text read is both the result's text
// and its structured content): all of it, or a prefix ending on a whole
// character.
func textFits(text []byte, copies, budget int64) int {
	var cost int64
	for i, r := range string(text) {
		cost += copies * jsonCost(r)
		if cost > budget {
			return i
		}
	}
	return len(text)
}

// messageNote says why a result stopped short of what was asked.
func messageNote(e *catalog.Env, next int64) string {
	return fmt.Sprintf("one result carries at most %d bytes (the message limit); read on with offset %d", e.Limits.MaxMessageBytes, next)
}

// fitText cuts a text read that would not fit one result (its text is
// the result's text and its structured content) to the prefix that does,
// truncated: the agent reads on from where it ends.
func fitText(e *catalog.Env, fr *guestctl.FileRead) {
	if !isText(fr.Data) {
		return
	}
	if keep := textFits(fr.Data, 2, resultBudget(e)); keep < len(fr.Data) {
		fr.Data, fr.Truncated, fr.EOF = fr.Data[:keep], true, false
	}
}

// bytesMoved is the call's byte progress (nil without a progress token).
func bytesMoved(c *catalog.Call) func(done, total int64) {
	if c.Progress == nil {
		return nil
	}
	return c.Progress.Bytes
}

// isLimit reports whether err is the guest's refusal of an archive over
// its limits, saying what.
func isLimit(err error, what string) bool {
	var he *guestctl.Error
	return errors.As(err, &he) && he.Code == wire.CodeRefused && he.Reason == wire.ReasonLimit && strings.Contains(he.Message, what)
}

// tarTooLarge refuses an archive that one result would not carry.
func tarTooLarge(e *catalog.Env, p string, gz bool, err error) catalog.Result {
	how := "archive its subdirectories one at a time (vm_dir_list shows them and their sizes)"
	if !gz {
		how += ", or ask with gzip: true"
	}
	msg := fmt.Sprintf("the tar of %s is more than one result carries (%d bytes of tar, base64 in a message of at most %d bytes): %s", p, base64Budget(resultBudget(e)), e.Limits.MaxMessageBytes, how)
	r := catalog.Failure(catalog.TagInvalid, msg, true)
	r.Detail = msg + ": " + err.Error()
	return r
}
