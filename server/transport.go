package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"log/slog"
	"strings"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/vmgate/vmgate/server/jsonrpc"
)

// What the transports (server/stdio, server/mcphttp, server/operator) use
// of the gate. A transport finds its caller's grant (Grant, GrantForToken),
// hands every message with the caller's Conn to Handle (a line-oriented
// transport, which writes what Handle returns) or Admit (one that serves
// the message with mcp-go's own handler), and never calls a tool handler
// itself. Server notifications reach a client through the sessions the
// transports register with MCP() and attach to their grant
// (AttachSession, notify.go).

// Conn is who is calling and how: a transport makes one per client (stdio)
// or request (HTTP) and passes it with every message.
type Conn struct {
	Grant     *Grant
	Transport string // "stdio" or "http"; what the audit log records
	// Session is the id of the MCP session the message came in (one the
	// transport attached, AttachSession); empty when it has none (a
	// 2026-07-28 HTTP client, or a message outside any session).
	Session string
}

// ConnContext is ctx carrying c, as the gate reads it (mcp-go's own
// handlers: tools/list's filter, the HTTP session registry).
func ConnContext(ctx context.Context, c *Conn) context.Context {
	return context.WithValue(ctx, connKey, c)
}

// ConnFrom is the Conn ConnContext put in ctx, or nil.
func ConnFrom(ctx context.Context) *Conn {
	c, _ := ctx.Value(connKey).(*Conn)
	return c
}

// Grant returns the grant name the server was created with.
func (s *Server) Grant(name string) (*Grant, bool) {
	g, ok := s.grants[name]
	return g, ok
}

// GrantForToken finds the grant of the one bearer token in auth (the
// values of the Authorization header), or nil. Every grant's hash is
// compared, in constant time, whatever matches.
func (s *Server) GrantForToken(auth []string) *Grant {
	if len(auth) != 1 {
		return nil
	}
	scheme, token, ok := strings.Cut(auth[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return nil
	}
	token = strings.TrimSpace(token)
	if token == "" {
		return nil
	}
	sum := sha256.Sum256([]byte(token))
	var found *Grant
	for i := range s.tokens {
		if subtle.ConstantTimeCompare(sum[:], s.tokens[i].hash[:]) == 1 {
			found = s.tokens[i].grant
		}
	}
	return found
}

// Handle runs one message of c through the gate and, if the gate lets it
// pass, through mcp-go (a gated tools/call: its handler directly,
// dispatch.go). It returns the response to send (nil for none).
func (s *Server) Handle(ctx context.Context, c *Conn, raw []byte) (out []byte) {
	v := s.gateMessage(ctx, c, raw)
	if v.ctx == nil {
		return v.reply
	}
	if v.t != nil {
		defer s.settle(v.t)
	}
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("server: panic while handling a message", "panic", p)
			out = jsonrpc.ErrorReply(nil, mcp.INTERNAL_ERROR, "internal error")
		}
	}()
	var resp mcp.JSONRPCMessage
	direct := false
	if v.t != nil {
		resp, direct = s.callDirect(v)
	}
	if v.cancelsSet {
		s.direct.cancel(inflightKey(v.ctx, v.cancels))
	}
	if !direct {
		resp = s.mcp.HandleMessage(v.ctx, raw)
	}
	if resp == nil {
		return nil
	}
	b, err := json.Marshal(resp)
	if err != nil {
		s.log.Error("server: cannot encode a response", "err", err)
		return jsonrpc.ErrorReply(nil, mcp.INTERNAL_ERROR, "cannot encode the response")
	}
	return b
}

// Admission is the gate's answer to one message of a transport that
// serves messages with mcp-go's own handler (streamable HTTP).
type Admission struct {
	s *Server
	v verdict
}

// Admit runs one message of c through the gate. The transport answers
// with Reply when Context is nil, else serves the message with mcp-go
// under Context; either way it calls Done once it answered.
func (s *Server) Admit(ctx context.Context, c *Conn, raw []byte) Admission {
	return Admission{s: s, v: s.gateMessage(ctx, c, raw)}
}

// Reply is the answer to a message the gate did not pass on (nil: none;
// the message was a notification).
func (a Admission) Reply() []byte { return a.v.reply }

// Context is the context to serve a passed message under (the gate's
// single-use ticket in it, for a tools/call), or nil.
func (a Admission) Context() context.Context { return a.v.ctx }

// Done finishes a passed tools/call once it was answered (its outcome
// record); for any other message it does nothing.
func (a Admission) Done() {
	if a.v.t != nil {
		a.s.settle(a.v.t)
	}
}

// MaxMessageBytes bounds one message (Limits.MaxMessageBytes).
func (s *Server) MaxMessageBytes() int { return s.limits.MaxMessageBytes }

// ShutdownGrace is how long a transport lets calls in flight finish after
// its input ends, before it cancels them (Config.ShutdownGrace).
func (s *Server) ShutdownGrace() time.Duration { return s.grace }

// Logger is the server's logger.
func (s *Server) Logger() *slog.Logger { return s.log }

// Now is the server's clock.
func (s *Server) Now() time.Time { return s.now() }
