package server

import (
	"context"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/server/catalog"
)

// What a call that passed the gate carries to its handler, and how it ends:
// the ticket the handler claims (runTool), and the outcome record and
// refund once it answered (settle).

type ctxKey int

const (
	connKey ctxKey = iota
	ticketKey
)

// call is one tools/call that passed the gate: what its handler gets
// (catalog.Call) and what the gate keeps of it.
type call struct {
	catalog.Call
	spec *catalog.Tool
	// snapshot is the decision's snapshot_before; undo the snapshot taken
	// for it (undo.go).
	snapshot *policy.SnapshotBefore
	undo     *undoEntry
}

// ticket is the gate's single-use permission for one call. Only the gate
// creates tickets; handlers claim them.
type ticket struct {
	server   *Server
	call     *call
	claimed  chan struct{}   // closed by the handler that claims the ticket
	res      *catalog.Result // set by that handler before it returns
	start    time.Time       // the decision and reservation time (Refund needs it)
	counters []policy.Counter
	cancel   context.CancelFunc
	// elicit, when set, is the approval the handler must get from the
	// client (elicitation/create) before the call runs; see elicit_legacy.go.
	elicit *clientAsk
}

// verdict is what the gate decided for one message.
type verdict struct {
	reply []byte          // a response to send instead of passing the message on
	ctx   context.Context // non-nil: pass the message to mcp-go with this context
	t     *ticket         // set with ctx for a gated tools/call: settle it afterwards
	// direct is what a gated tools/call holds for the direct path
	// (dispatch.go); set with t.
	direct *directMessage
	// cancels, for a notifications/cancelled, is the request id it names,
	// as encoding/json reads it (cancelsSet: it names one).
	cancels    any
	cancelsSet bool
}

// toolHandler is what mcp-go runs for spec: runTool.
func (s *Server) toolHandler(spec *catalog.Tool) mcpserver.ToolHandlerFunc {
	return func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return s.runTool(ctx, spec, req), nil
	}
}

// runTool runs one call of spec, from mcp-go (toolHandler) or from handle
// (dispatch.go): only with the ticket the gate put in the context for
// exactly this call, which it claims.
func (s *Server) runTool(ctx context.Context, spec *catalog.Tool, req mcp.CallToolRequest) *mcp.CallToolResult {
	t, _ := ctx.Value(ticketKey).(*ticket)
	if t == nil || t.server != s || t.call.spec != spec || req.Params.Name != spec.Name {
		s.log.Error("server: tool handler reached without a gate ticket", "tool", spec.Name)
		return catalog.ErrorResult(TagDenied, "this call did not pass the policy gate", nil)
	}
	select {
	case <-t.claimed:
		s.log.Error("server: gate ticket used twice", "tool", spec.Name, "call", t.call.ID)
		return catalog.ErrorResult(TagDenied, "this call did not pass the policy gate", nil)
	default:
		close(t.claimed)
	}
	// The driver's work runs on the call's own context (deadline and all):
	// a cancelled request (notifications/cancelled, a client gone) ends it.
	defer context.AfterFunc(ctx, t.cancel)()
	if t.elicit != nil { // elicit_legacy.go: asks without any gate lock held
		if r, ok := s.elicitApproval(ctx, t); !ok {
			t.res = &r
			return r.MCP()
		}
	}
	prog, stop := s.reportProgress(ctx, req, spec.Name)
	defer stop()
	t.call.Progress = prog
	r := s.run(t.call)
	t.res = &r
	return r.MCP()
}

// run runs c's handler, after its undo snapshot when the policy wants one
// (undo.go).
func (s *Server) run(c *call) catalog.Result {
	if c.wantsUndo() {
		if r := s.takeUndo(c); r != nil {
			return c.Explain(*r)
		}
	}
	return c.Explain(c.withUndo(c.spec.Run(s.env, &c.Call)))
}

// settle finishes a gated call after it was answered: the outcome record,
// and the refund of a call that failed before any side effect (or that
// mcp-go never handed to its handler).
func (s *Server) settle(t *ticket) {
	defer s.calls.Done()
	t.cancel()
	select {
	case <-t.claimed:
	default:
		// mcp-go answered without running the handler: nothing happened.
		t.res = &catalog.Result{Tag: TagBackend, NoEffect: true, Detail: "handler not run"}
	}
	if t.res == nil {
		// The handler panicked (handle answered an internal error): what
		// it did is unknown, so nothing is refunded.
		t.res = &catalog.Result{Tag: TagBackend, Detail: "the handler panicked"}
	}
	r := t.res
	refund := r.NoEffect && len(t.counters) > 0
	if refund {
		s.refund(t.call.ID, t.start, t.counters)
	}
	rec := audit.Record{CallID: t.call.ID, Grant: t.call.Grant.Name, Transport: t.call.Transport, Tool: t.call.spec.Name, VM: t.call.VM}
	if u := t.call.undo; u != nil {
		rec.Snapshot, rec.SnapshotID, rec.SnapshotTaken = u.Name, u.ID, u.Taken
	}
	s.outcome(rec, r.Outcome(), r.Detail, t.start, refund)
}

// outcome appends the outcome record of the call rec names, without
// waiting for an fsync (it rides the next group commit).
func (s *Server) outcome(rec audit.Record, outcome, detail string, start time.Time, refunded bool) {
	out := audit.Record{
		Kind: audit.KindOutcome, CallID: rec.CallID, Grant: rec.Grant, Transport: rec.Transport, Tool: rec.Tool, VM: rec.VM,
		Outcome: outcome, Reason: detail, Refunded: refunded, Snapshot: rec.Snapshot, SnapshotID: rec.SnapshotID, SnapshotTaken: rec.SnapshotTaken,
		DurationMS: float64(s.now().Sub(start).Microseconds()) / 1000,
	}
	if err := s.audit.AppendLazy(context.Background(), out); err != nil {
		s.log.Error("server: audit outcome record failed", "call", rec.CallID, "err", err)
	}
}

// refund gives back the reservations of call id made at at.
func (s *Server) refund(id string, at time.Time, counters []policy.Counter) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.store.Refund(ctx, id, at, counters); err != nil {
		s.log.Warn("server: refund failed", "call", id, "err", err)
	}
}

// filterTools hides from tools/list what the caller's policy hides.
func (s *Server) filterTools(ctx context.Context, tools []mcp.Tool) []mcp.Tool {
	c := ConnFrom(ctx)
	if c == nil {
		return nil
	}
	eng := s.policyOf(c.Grant)
	if eng == nil {
		return nil
	}
	out := tools[:0:0]
	for _, t := range tools {
		if eng.Visible(t.Name) {
			out = append(out, t)
		}
	}
	return out
}
