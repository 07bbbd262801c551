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
// client asked for them (params._meta.progressToken): one every
// s.progressEvery, with the seconds elapsed as the (increasing) progress and
// a message naming the tool, and what the handler last reported (prog:
// the Progress of its catalog.Call, nil without a token), until the
// returned stop function is called. Calls that finish within the first
// interval send none. A client without a token gets nothing. stop waits
// for the reporter, so no notification follows the call's result.
func (s *Server) reportProgress(ctx context.Context, req mcp.CallToolRequest, tool string) (prog *catalog.Progress, stop func()) {
	if req.Params.Meta == nil || req.Params.Meta.ProgressToken == nil {
		return nil, func() {}
	}
	token := req.Params.Meta.ProgressToken
	prog = &catalog.Progress{}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		start := time.Now()
		tick := time.NewTicker(s.progressEvery)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
				elapsed := time.Since(start)
				msg := fmt.Sprintf("%s running for %s", tool, elapsed.Round(time.Second))
				if latest := prog.Latest(); latest != "" {
					msg += ": " + latest
				}
				err := s.mcp.SendNotificationToClient(ctx, "notifications/progress", map[string]any{
					"progressToken": token,
					"progress":      elapsed.Seconds(),
					"message":       msg,
				})
				if err != nil {
					s.log.Debug("server: progress notification not sent", "tool", tool, "err", err)
					return
				}
			}
		}
	}()
	return prog, func() {
		close(done)
		wg.Wait()
	}
}
