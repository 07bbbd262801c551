package server

import (
	"encoding/json"
	"errors"
	"maps"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/vmgate/vmgate/policy/audit"
)

// Notifications: what the server tells a client of what it did on the
// agent's behalf that the agent cannot see otherwise (MCP logging,
// notifications/message, at or above the level the session set with
// logging/setLevel; events.go says which events at which level), and
// notifications/tools/list_changed when a policy reload changed the tools
// a session's grant sees.
//
// A transport attaches each MCP session it registered with MCP() to the
// grant it serves (AttachSession): server/stdio its one session,
// server/mcphttp every session id it issues, until the session ends. A
// 2026-07-28 HTTP client has no session and gets none of these.
//
// Sending never blocks: a notification goes into the session's bounded
// queue (the channel mcp-go's session has: 64 on stdio, 100 on HTTP), and
// one that does not fit, because the client reads too slowly or an HTTP
// client keeps no stream open, is dropped and counted
// (NotificationsDropped). A call never waits for a client to read.
//
// Nothing secret goes out: a call's arguments are shown as the audit log
// keeps them (audit.Redact: stdin, file content and env values as their
// SHA-256 and length), and only while their redacted form is small.

// LoggerName is the logger of every notifications/message the server sends.
const LoggerName = "vmgate"

// maxNotifiedArgsBytes bounds the redacted arguments a notification
// carries; larger ones are left out (their size said instead).
const maxNotifiedArgsBytes = 2048

// notifier holds the attached sessions and what was sent to them.
//
// Concurrency: mu guards byGrant; sending copies the ids and sends
// without mu held, so a transport may attach and detach while a
// notification goes out.
type notifier struct {
	mu      sync.Mutex
	byGrant map[string]map[string]struct{} // grant name -> session ids

	dropped atomic.Uint64
}

// NotificationsDropped counts the notifications dropped so far because a
// session's queue was full.
func (s *Server) NotificationsDropped() uint64 { return s.notify.dropped.Load() }

// AttachSession makes the MCP session id (registered with MCP()) one of
// grant's: the server's notifications for that grant reach it until
// detach is called (when the session ends). An unknown grant or an empty
// id attaches nothing. Safe for concurrent use; detach may be called more
// than once.
func (s *Server) AttachSession(grant, id string) (detach func()) {
	if _, ok := s.grants[grant]; !ok || id == "" {
		return func() {}
	}
	n := &s.notify
	n.mu.Lock()
	if n.byGrant == nil {
		n.byGrant = map[string]map[string]struct{}{}
	}
	if n.byGrant[grant] == nil {
		n.byGrant[grant] = map[string]struct{}{}
	}
	n.byGrant[grant][id] = struct{}{}
	n.mu.Unlock()
	return func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		if ids := n.byGrant[grant]; ids != nil {
			delete(ids, id)
			if len(ids) == 0 {
				delete(n.byGrant, grant)
			}
		}
	}
}

// sessionsOf returns the session ids attached to grant.
func (n *notifier) sessionsOf(grant string) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Collect(maps.Keys(n.byGrant[grant]))
}

// grantsSeeing returns the grants that see some VM of backend.
func (s *Server) grantsSeeing(backend string) []string {
	var out []string
	for name, g := range s.grants {
		if grantSeesBackend(g, backend) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// grantSeesBackend reports whether a VM of backend can match one of g's
// globs (no globs: every VM).
func grantSeesBackend(g *Grant, backend string) bool {
	if len(g.VMs) == 0 {
		return true
	}
	for _, glob := range g.VMs {
		b, _, _ := strings.Cut(glob, "/")
		if ok, _ := path.Match(b, backend); ok {
			return true
		}
	}
	return false
}

// logEvent is one notifications/message: its level and data (an object
// with at least "event" and "message").
type logEvent struct {
	level mcp.LoggingLevel
	data  map[string]any
}

// logTo sends ev to session id, if its level lets it through. It never
// blocks.
func (s *Server) logTo(id string, ev logEvent) {
	err := s.mcp.SendLogMessageToSpecificClient(id, mcp.NewLoggingMessageNotification(ev.level, LoggerName, ev.data))
	s.counted(id, "notifications/message", err)
}

// logToGrant sends ev to every session of grant.
func (s *Server) logToGrant(grant string, ev logEvent) {
	for _, id := range s.notify.sessionsOf(grant) {
		s.logTo(id, ev)
	}
}

// toolsChanged sends notifications/tools/list_changed to every session of
// grant.
func (s *Server) toolsChanged(grant string) {
	for _, id := range s.notify.sessionsOf(grant) {
		err := s.mcp.SendNotificationToSpecificClient(id, string(mcp.MethodNotificationToolsListChanged), nil)
		s.counted(id, string(mcp.MethodNotificationToolsListChanged), err)
	}
}

// counted counts a notification to session id that did not fit its
// queue. A session that is gone or not initialized yet gets nothing and
// counts nothing.
func (s *Server) counted(id, method string, err error) {
	switch {
	case err == nil:
	case errors.Is(err, mcpserver.ErrNotificationChannelBlocked):
		s.notify.dropped.Add(1)
		s.log.Debug("server: notification dropped: the session's queue is full", "session", id, "method", method)
	default:
		s.log.Debug("server: notification not sent", "session", id, "method", method, "err", err)
	}
}

// notifiedArgs is args as a notification may carry them: redacted as the
// audit log keeps them, or nil when that is larger than
// maxNotifiedArgsBytes.
func notifiedArgs(args map[string]any) map[string]any {
	red := audit.Redact(args)
	if b, err := json.Marshal(red); err != nil || len(b) > maxNotifiedArgsBytes {
		return nil
	}
	return red
}
