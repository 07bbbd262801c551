package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/server/catalog"
)

// Client approval for clients older than protocol 2026-07-28: the
// server-to-client elicitation/create request of protocol 2025-06-18.
//
// The gate lets such a call through with decision approve (its counters
// reserved, its decision record durable) and a clientAsk on its ticket. The
// tool handler, which runs inside mcp-go with the client's session in its
// context, then asks the client before anything runs:
//
//   - over stdio through stdioSession.RequestElicitation (this file); the
//     stdio loop hands the client's response to deliverResponse;
//   - over streamable HTTP through mcp-go's session, which writes the request
//     on the SSE stream of the pending POST and takes the answer from the
//     client's next POST.
//
// The wait is bounded by the call's deadline and the approval's ttl, and
// holds no lock of the gate. Only action accept with content
// {"approve": true} lets the call run, in the same request: the approval is
// bound to this very call (grant, tool, arguments) and cannot be used
// again. A decline, a cancel, an error, a malformed answer, no answer in
// time, or a client that did not declare elicitation at initialize deny the
// call; its reservations are refunded. Either way a second decision record
// (allow or deny, approval id "client") says what the user answered.

// clientAsk is the approval a call's handler must get from the client.
type clientAsk struct {
	params mcp.ElicitationParams
	ttl    time.Duration // how long the user may take, within the call's deadline
}

// ErrNoElicitation: the client did not declare the elicitation capability.
var ErrNoElicitation = errors.New("the client did not declare the elicitation capability")

// elicitApproval asks the client of ctx's session to approve t's call. It
// returns ok=true when the user approved explicitly, else the denial.
func (s *Server) elicitApproval(ctx context.Context, t *ticket) (r catalog.Result, ok bool) {
	cl := t.call
	rec := audit.Record{
		Kind: audit.KindDecision, CallID: cl.ID, Grant: cl.Grant.Name, Transport: cl.Transport,
		Tool: cl.spec.Name, VM: cl.VM, ApprovalID: approvalIDClient,
	}
	deny := func(reason, msg string) (catalog.Result, bool) {
		rec.Decision, rec.Reason = policy.Deny.String(), "client approval: "+reason
		if err := s.audit.AppendLazy(context.WithoutCancel(ctx), rec); err != nil {
			s.log.Error("server: audit record of a client's denial failed", "call", cl.ID, "err", err)
		}
		return catalog.Result{Tag: TagDenied, Text: msg, NoEffect: true, Detail: rec.Reason}, false
	}

	answer, err := askClient(ctx, cl.Ctx, s.mcp, t.elicit)
	switch {
	case errors.Is(err, ErrNoElicitation), errors.Is(err, mcpserver.ErrNoActiveSession), errors.Is(err, mcpserver.ErrElicitationNotSupported):
		return deny("the client has no elicitation capability",
			"this call needs the approval of your user, and this client cannot ask (it declared no elicitation capability); the call is refused")
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return deny("no answer in time",
			"your user did not answer the approval request in time; the call is refused")
	case err != nil:
		return deny(catalog.Truncate(err.Error(), 200),
			"the approval request failed ("+catalog.Truncate(err.Error(), 120)+"); the call is refused")
	case !approved(string(answer.Action), answer.Content):
		action := string(answer.Action)
		if action == "" {
			action = "no action"
		}
		return deny(catalog.Truncate(action, 20), "your user did not approve this call ("+catalog.Truncate(action, 20)+")")
	}
	rec.Decision, rec.Reason = policy.Allow.String(), "approved by the client's user through elicitation/create"
	// Durable before the call runs, like every decision that lets one run.
	if _, err := s.audit.Append(context.WithoutCancel(ctx), rec); err != nil {
		s.log.Error("server: audit record of a client's approval failed; call refused", "call", cl.ID, "err", err)
		return catalog.Result{Tag: TagDenied, Text: auditRefusal(err), NoEffect: true, Detail: "audit: " + err.Error()}, false
	}
	return catalog.Result{}, true
}

// askClient sends ask to the client of ctx's session (ctx: the context
// mcp-go gave the handler) and waits for its answer, until deadline (the
// call's context) ends or ask's ttl passes.
func askClient(ctx, deadline context.Context, m *mcpserver.MCPServer, ask *clientAsk) (*mcp.ElicitationResult, error) {
	sess := mcpserver.ClientSessionFromContext(ctx)
	if sess == nil {
		return nil, mcpserver.ErrNoActiveSession
	}
	ci, ok := sess.(mcpserver.SessionWithClientInfo)
	if !ok || ci.GetClientCapabilities().Elicitation == nil {
		return nil, ErrNoElicitation
	}
	ctx, cancel := context.WithTimeout(ctx, ask.ttl)
	defer cancel()
	if dl, ok := deadline.Deadline(); ok {
		var c2 context.CancelFunc
		ctx, c2 = context.WithDeadline(ctx, dl)
		defer c2()
	}
	stop := context.AfterFunc(deadline, cancel)
	defer stop()
	res, err := m.RequestElicitation(ctx, mcp.ElicitationRequest{
		Request: mcp.Request{Method: string(mcp.MethodElicitationCreate)},
		Params:  ask.params,
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("elicitation/create: %w", ctx.Err())
		}
		return nil, fmt.Errorf("elicitation/create: %w", err)
	}
	return res, nil
}
