package server

import (
	"context"
	"crypto/rand"
	"fmt"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/server/catalog"
	"github.com/vmgate/vmgate/server/jsonrpc"
)

// Refusals: how the gate ends a call it does not run. Each is recorded in
// the audit log without waiting for an fsync (nothing ran, and a flood of
// bad calls must not cost a flood of fsyncs) and answered with a tagged
// tool error.

// Audit decisions written by the gate besides the policy verdicts.
const (
	decisionInvalid   = "invalid"
	decisionUnknownVM = "unknown_vm"
	decisionError     = "error"
)

// maxAuditArgsBytes: arguments of a refused call larger than this are not
// copied into its audit record (the record names their size instead).
const maxAuditArgsBytes = 64 << 10

// refusal is why the gate ends a call without running it: what the audit
// record says and what the agent reads.
type refusal struct {
	decision string // the record's decision: a policy verdict, or invalid, unknown_vm, error
	tag      string // the result's tag
	msg      string // what the agent reads after the tag; the record's reason when it has none
	detail   string // added to the record's reason only
	// extra are fields of the result's structured content besides error
	// and message (retry_after_s, approval_id).
	extra map[string]any
}

// invalidArg is the refusal of arguments that are not what the tool takes.
func invalidArg(msg string) refusal {
	return refusal{decision: decisionInvalid, tag: TagInvalid, msg: msg}
}

// denied is the refusal of a call the policy (or the client's user, or an
// operator) does not allow.
func denied(msg string) refusal {
	return refusal{decision: policy.Deny.String(), tag: TagDenied, msg: msg}
}

// rateLimited is the refusal of a call over a limit, retry in secs.
func rateLimited(msg string, secs int64) refusal {
	return refusal{decision: policy.RateLimited.String(), tag: TagRateLimited, msg: msg, extra: map[string]any{"retry_after_s": secs}}
}

// refuse ends g's call with r (or, for a notification, with no reply).
func (g *gating) refuse(r refusal) (verdict, bool) {
	if !g.HasID {
		g.s.record(g.ctx, g.rec, r)
		return verdict{}, true
	}
	return g.s.refuse(g.ctx, g.ID, g.rec, r), true
}

// invalid ends g's call as invalidArg(msg).
func (g *gating) invalid(msg string) (verdict, bool) { return g.refuse(invalidArg(msg)) }

// refuse records rec refused as r and answers request id with r.
func (s *Server) refuse(ctx context.Context, id any, rec audit.Record, r refusal) verdict {
	s.record(ctx, rec, r)
	return verdict{reply: jsonrpc.ResultReply(id, catalog.ErrorResult(r.tag, r.msg, r.extra))}
}

// record appends rec as refused for r, without waiting for an fsync.
func (s *Server) record(ctx context.Context, rec audit.Record, r refusal) {
	rec.Decision = r.decision
	if rec.Reason == "" {
		rec.Reason = r.msg
	}
	if r.detail != "" {
		rec.Reason += ": " + r.detail
	}
	if err := s.audit.AppendLazy(ctx, rec); err != nil {
		s.log.Error("server: audit record of a refused call failed", "call", rec.CallID, "err", err)
	}
}

// refuseMalformed answers a message that failed strict decoding. If
// encoding/json (what mcp-go uses) would read it as a tools/call, it gets
// a tagged tool error and an audit record; otherwise a JSON-RPC error.
// Either way mcp-go never sees it.
func (s *Server) refuseMalformed(ctx context.Context, c *Conn, raw []byte, cause error) verdict {
	peek := jsonrpc.Peek(raw)
	id := peek.ID
	why := catalog.Truncate(cause.Error(), 200)
	if peek.Method == string(mcp.MethodToolsCall) || jsonrpc.MayBeToolsCall(raw) {
		rec := audit.Record{Kind: audit.KindDecision, CallID: rand.Text(), Grant: c.Grant.Name, Transport: c.Transport, Tool: catalog.Truncate(peek.Tool, 128)}
		rec.Reason = fmt.Sprintf("malformed tools/call of %d bytes", len(raw))
		if len(raw) > s.limits.MaxMessageBytes {
			why += tooLargeAdvice(peek.Tool, s.limits)
		}
		r := invalidArg("rejected: " + why)
		if id == nil {
			s.record(ctx, rec, r)
			return verdict{reply: jsonrpc.ErrorReply(nil, mcp.INVALID_REQUEST, "invalid request: "+why)}
		}
		return s.refuse(ctx, id, rec, r)
	}
	if id == nil {
		return verdict{reply: jsonrpc.ErrorReply(nil, mcp.PARSE_ERROR, "parse error: "+why)}
	}
	return verdict{reply: jsonrpc.ErrorReply(id, mcp.INVALID_REQUEST, "invalid request: "+why)}
}

// tooLargeAdvice says how a tool's data goes in messages within l's limit.
func tooLargeAdvice(tool string, l catalog.Limits) string {
	switch tool {
	case "vm_file_write":
		return fmt.Sprintf("; write the data in ranges of at most %d bytes (their base64 within the limit): the first whole, the others with append or offset", l.RawBudget())
	case "vm_archive_write":
		return "; send the tree as several tars (one per subdirectory), or gzip it"
	}
	return ""
}
