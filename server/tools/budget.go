package tools

import (
	"github.com/vmgate/vmgate/internal/guestctl"
	"github.com/vmgate/vmgate/server/catalog"
)

// What one result carries: catalog/budget.go.

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
