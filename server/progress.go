package server

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/vmgate/vmgate/server/catalog"
)

// defaultProgressEvery is how often a long call is reported on.
const defaultProgressEvery = time.Second

// reportProgress sends MCP progress notifications for a running call whose
// client asked for them (params._meta.progressToken), until the returned
// stop function is called: one every s.progressEvery with the seconds
// elapsed as the progress and a message naming the tool and what the
// handler last reported (prog: the Progress of its catalog.Call, nil
// without a token); and, for a call that moves data (prog.Bytes), one as
// each piece moves, with progress and total in bytes. Progress only ever
// increases: a notification that would not raise it is not sent. Calls
// that finish within the first interval and move no piece send none. A
// client without a token gets nothing. stop waits for the reporter (which
// first reports the bytes moved since its last notification), so no
// notification follows the call's result.
func (s *Server) reportProgress(ctx context.Context, req mcp.CallToolRequest, tool string) (prog *catalog.Progress, stop func()) {
	if req.Params.Meta == nil || req.Params.Meta.ProgressToken == nil {
		return nil, func() {}
	}
	r := &progressReporter{s: s, ctx: ctx, token: req.Params.Meta.ProgressToken, tool: tool, prog: catalog.NewProgress(), start: time.Now()}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(s.progressEvery)
		defer tick.Stop()
		for {
			select {
			case <-done:
				r.flush() // the last piece's bytes, before the result
				return
			case <-ctx.Done():
				return
			case <-r.prog.Wake():
			case <-tick.C:
			}
			if !r.send() {
				return
			}
		}
	}()
	return r.prog, func() {
		close(done)
		wg.Wait()
	}
}

// progressReporter is the state of one call's progress notifications
// (its goroutine's alone).
type progressReporter struct {
	s     *Server
	ctx   context.Context
	token mcp.ProgressToken
	tool  string
	prog  *catalog.Progress
	start time.Time
	last  float64 // the progress last sent
}

// send sends a notification if the progress rose; false when sending failed.
func (r *progressReporter) send() bool {
	elapsed := time.Since(r.start)
	msg := fmt.Sprintf("%s running for %s", r.tool, elapsed.Round(time.Second))
	params := map[string]any{"progressToken": r.token}
	progress := elapsed.Seconds()
	if done, total, ok := r.prog.Moved(); ok {
		progress = float64(done)
		params["total"] = float64(total)
		msg += fmt.Sprintf(", %s of %s moved", mib(done), mib(total))
	}
	if progress <= r.last {
		return true
	}
	if latest := r.prog.Latest(); latest != "" {
		msg += ": " + latest
	}
	params["progress"], params["message"] = progress, msg
	if err := r.s.mcp.SendNotificationToClient(r.ctx, "notifications/progress", params); err != nil {
		r.s.log.Debug("server: progress notification not sent", "tool", r.tool, "err", err)
		return false
	}
	r.last = progress
	return true
}

// flush sends the bytes moved, if they rose since the last notification.
func (r *progressReporter) flush() {
	if _, _, ok := r.prog.Moved(); ok {
		r.send()
	}
}

// mib is n bytes in MiB for people ("3.5 MiB").
func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
