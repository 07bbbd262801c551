package tools

import (
	"errors"
	"fmt"
	"strings"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/internal/guestctl"
	"github.com/vmgate/vmgate/server/catalog"
)

// What one result carries: catalog/budget.go.

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
	if keep := catalog.TextFits(fr.Data, 2, e.Limits.ResultBudget()); keep < len(fr.Data) {
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
	msg := fmt.Sprintf("the tar of %s is more than one result carries (%d bytes of tar, base64 in a message of at most %d bytes): %s", p, e.Limits.RawBudget(), e.Limits.MaxMessageBytes, how)
	r := catalog.Failure(catalog.TagInvalid, msg, true)
	r.Detail = msg + ": " + err.Error()
	return r
}
