package server

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/vmgate/vmgate/server/jsonrpc"
)

// Direct dispatch of a gated tools/call (stdio, through handle).
//
// A tools/call that passed the gate used to go to mcp-go's HandleMessage,
// which decoded the message again with encoding/json, routed it and ran
// the tool's handler: a fifth of the CPU of a call. The gate has already
// decoded it (strictly), so handle runs the handler itself (runTool, the
// same function mcp-go runs) and encodes the answer with mcp-go's own
// types, byte for byte what mcp-go wrote.
//
// What mcp-go v1.2.1 does for a tools/call besides running the handler
// (request_handler.go HandleMessage, server.go handleToolCall), and why
// the direct path does the same or need not:
//   - hooks (OnRequestInitialization, BeforeCallTool, AfterCallTool,
//     OnError), tool handler middlewares, input and output schema
//     validation, a request logger, a tracer and a _meta propagator: New
//     registers none of them (mcpserver.With* there: tool capabilities, the
//     tool filter, instructions), so each is a no-op.
//   - the tool filter (WithToolFilter(s.filterTools)): checked here the
//     way mcp-go checks it; a call it hides goes to mcp-go, which answers
//     "tool not found" as before (the gate refuses a hidden tool first, so
//     only a policy reload between the two gets there).
//   - session tools (SessionWithTools), task tools and task-augmented
//     calls: stdioSession has no tools of its own, no tool is a task tool
//     or has an Execution, and the gate refuses a params.task.
//   - protocol 2026-07-28 requests (_meta protocol version): header checks,
//     session synthesis and result decoration apply to them, so they go
//     to mcp-go.
//   - a message that encoding/json reads differently from the gate (a
//     "result" member, which mcp-go takes for a response; a number no
//     float64 holds, which it refuses; requestState or inputResponses,
//     which it decodes into typed fields): goes to mcp-go.
//   - the handler never returns an error, a nil result or a result that
//     asks for input (elicit.go answers 2026-07-28 clients from the gate),
//     so handlerError and the multi round-trip bridge never run.
//   - the context: mcp-go adds its server (ServerFromContext, which no
//     code the handler reaches reads), the request's protocol information
//     (added here), and a cancel func that notifications/cancelled
//     reaches (directCalls, here).
//
// HTTP keeps going through mcp-go's streamable HTTP server, which also
// writes the response (and upgrades to SSE for progress notifications).

// directCalls are the cancel funcs of the calls running on the direct
// path, by the key mcp-go gives its own in-flight requests, so that
// notifications/cancelled cancels them as it cancels mcp-go's. Unlike
// mcp-go, the direct path then sends no response: MCP says the receiver of
// a cancellation should not answer the request, and a client that
// cancelled has forgotten the id (the TypeScript SDK reports a response
// to it as an error: "Received a response for an unknown message ID").
// The audit log still records how the call ended.
//
// Concurrency: safe for concurrent use.
type directCalls struct{ m sync.Map }

// errCancelledByClient is the cause of a direct call's context that
// notifications/cancelled ended.
var errCancelledByClient = errors.New("the client cancelled the request")

// inflightKey is mcp-go's key of a request in flight: the session id and
// the request id as encoding/json decoded it (float64 or string).
func inflightKey(ctx context.Context, id any) string {
	if sess := mcpserver.ClientSessionFromContext(ctx); sess != nil {
		return fmt.Sprintf("%s:%v", sess.SessionID(), id)
	}
	return fmt.Sprintf(":%v", id)
}

// cancel cancels the direct call that key names, if one runs.
func (d *directCalls) cancel(key string) {
	if c, ok := d.m.LoadAndDelete(key); ok {
		c.(context.CancelCauseFunc)(errCancelledByClient)
	}
}

// directMessage is what the gate passes on of a tools/call for the
// direct path.
type directMessage struct {
	m      map[string]any // the whole message
	id     any            // string or json.Number
	params map[string]any
}

// callDirect runs the gated tools/call of v (gateMessage's verdict with a
// ticket) itself, and returns mcp-go's response to it, or nil when the
// client cancelled the call (directCalls). ok false: the call is one
// mcp-go must see (above); nothing was run.
func (s *Server) callDirect(v verdict) (resp mcp.JSONRPCMessage, ok bool) {
	dm, spec := v.direct, v.t.call.spec
	if dm == nil || s.noDirect || !directEnvelope(dm) {
		return nil, false
	}
	id, ok := jsonrpc.EncodingJSONValue(dm.id)
	if !ok {
		return nil, false
	}
	req := mcp.CallToolRequest{Request: mcp.Request{Method: string(mcp.MethodToolsCall)}}
	req.Params.Name = spec.Name
	req.Params.Arguments = dm.params["arguments"]
	if !jsonrpc.NumbersFit(req.Params.Arguments) {
		return nil, false
	}
	if raw, present := dm.params["_meta"]; present && raw != nil {
		meta, isObject := raw.(map[string]any)
		if !isObject {
			return nil, false // mcp-go refuses it as unparsable
		}
		std, ok := jsonrpc.EncodingJSONValue(meta)
		if !ok {
			return nil, false
		}
		req.Params.Meta = mcp.NewMetaFromMap(std.(map[string]any))
	}
	version := req.Params.Meta.ProtocolVersion()
	if mcp.IsModernProtocol(version) || len(s.filterTools(v.ctx, []mcp.Tool{{Name: spec.Name}})) != 1 {
		return nil, false
	}
	ctx := mcpserver.WithRequestProtocolInfo(v.ctx, &mcpserver.RequestProtocolInfo{ProtocolVersion: version})
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	key := inflightKey(ctx, id)
	s.direct.m.Store(key, cancel) // as mcp-go: a reused id replaces the entry
	defer s.direct.m.Delete(key)
	res := s.runTool(ctx, spec, req)
	if errors.Is(context.Cause(ctx), errCancelledByClient) {
		return nil, true // no response to a cancelled request
	}
	return mcp.NewJSONRPCResultResponse(mcp.NewRequestId(id), res), true
}

// directEnvelope reports whether the message holds only what the direct
// path reads the way encoding/json does.
func directEnvelope(dm *directMessage) bool {
	for k := range dm.m {
		if k != "jsonrpc" && k != "id" && k != "method" && k != "params" {
			return false
		}
	}
	for k := range dm.params {
		if k != "name" && k != "arguments" && k != "_meta" {
			return false
		}
	}
	return true
}
