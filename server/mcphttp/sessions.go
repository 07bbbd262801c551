package mcphttp

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/vmgate/vmgate/server"
)

// HTTP sessions (protocol versions before 2026-07-28; a 2026-07-28 client
// has none): the Mcp-Session-Id values the streamable HTTP transport
// issues at initialize, each bound to the grant whose initialize minted it.
//
// They are bounded three ways, so no client can make the server hold more
// than SessionLimits.MaxTotal of them however fast it initializes:
//
//   - at most MaxPerGrant per grant: a grant's new session evicts that
//     grant's least recently used one;
//   - at most MaxTotal in all: a new session evicts the least recently used
//     session of the grant holding the most (the grant that floods pays,
//     not the others);
//   - a session with no request for Idle, and no open GET stream, expires.
//
// A dropped session (evicted, expired or terminated) is gone everywhere:
// its id is unknown from then on (404, "initialize again", as the MCP
// specification asks), the state mcp-go keeps for it is released, and its
// open GET streams are ended. What one session costs is measured by
// TestHTTPSessionMemory (a few kilobytes, almost all of it mcp-go's).

// SessionLimits bound the sessions of the streamable HTTP transport.
type SessionLimits struct {
	// MaxPerGrant bounds the live sessions of one grant (default 64).
	MaxPerGrant int
	// MaxTotal bounds the live sessions of all grants (default 1024).
	MaxTotal int
	// Idle is how long a session lives without a request or an open
	// stream (default 30 minutes).
	Idle time.Duration
}

// The session limits of a config that sets none.
const (
	DefaultSessionsPerGrant = 64
	DefaultSessionsTotal    = 1024
	DefaultSessionIdle      = 30 * time.Minute
)

func (l SessionLimits) withDefaults() SessionLimits {
	if l.MaxPerGrant <= 0 {
		l.MaxPerGrant = DefaultSessionsPerGrant
	}
	if l.MaxTotal <= 0 {
		l.MaxTotal = DefaultSessionsTotal
	}
	if l.Idle <= 0 {
		l.Idle = DefaultSessionIdle
	}
	return l
}

// errUnknownHTTPSession: a session id this handler did not issue to the
// caller's grant (or one that was dropped).
var errUnknownHTTPSession = errors.New("unknown session")

// httpSessions is the registry of the session ids the HTTP transport
// issued; it is mcp-go's session id manager, resolved per request to the
// caller's grant.
//
// Concurrency: mu guards every field below it. release is called without
// mu held, after the sessions it names left the registry.
type httpSessions struct {
	now     func() time.Time
	limits  SessionLimits
	release func(ids []string) // frees mcp-go's state of dropped sessions (set by Handler)
	// attach makes a new session one of its grant's for the gate's
	// notifications (server.AttachSession; set by Handler); the detach
	// it returns is called under mu when the session is dropped.
	attach func(grant, id string) (detach func())

	mu      sync.Mutex
	byID    map[string]*httpSession
	grants  map[string]*grantSessionList
	total   int
	evicted uint64 // sessions dropped by a cap
	expired uint64 // sessions dropped for idling
}

// httpSession is one live session, a node of its grant's list.
type httpSession struct {
	id         string
	list       *grantSessionList
	last       time.Time
	prev, next *httpSession // towards more, towards less recently used
	streams    map[*context.CancelFunc]struct{}
	detach     func() // the gate's notifications stop reaching it
}

// grantSessionList holds one grant's sessions, most recently used first.
type grantSessionList struct {
	grant      string
	head, tail *httpSession
	n          int
}

func newHTTPSessions(now func() time.Time, limits SessionLimits) *httpSessions {
	return &httpSessions{
		now: now, limits: limits.withDefaults(), release: func([]string) {},
		attach: func(string, string) func() { return func() {} },
		byID:   map[string]*httpSession{}, grants: map[string]*grantSessionList{},
	}
}

func (l *grantSessionList) pushFront(e *httpSession) {
	e.list, e.prev, e.next = l, nil, l.head
	if l.head != nil {
		l.head.prev = e
	}
	l.head = e
	if l.tail == nil {
		l.tail = e
	}
	l.n++
}

func (l *grantSessionList) unlink(e *httpSession) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		l.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		l.tail = e.prev
	}
	e.prev, e.next = nil, nil
	l.n--
}

// removeLocked drops e from the registry, ends its streams and returns its id.
func (h *httpSessions) removeLocked(e *httpSession) string {
	e.list.unlink(e)
	if e.list.n == 0 {
		delete(h.grants, e.list.grant)
	}
	delete(h.byID, e.id)
	e.detach()
	h.total--
	for cancel := range e.streams {
		(*cancel)()
	}
	e.streams = nil
	return e.id
}

// idleLocked reports whether e has idled out at now.
func (h *httpSessions) idleLocked(e *httpSession, now time.Time) bool {
	return len(e.streams) == 0 && now.Sub(e.last) > h.limits.Idle
}

// sweepLocked drops every idled-out session. Lists are in order of last
// use, so each is walked from its tail only as far as idle sessions go
// (sessions with an open stream are stepped over).
func (h *httpSessions) sweepLocked(now time.Time, dropped []string) []string {
	for _, l := range h.grants {
		for e := l.tail; e != nil; {
			prev := e.prev
			if len(e.streams) == 0 {
				if !h.idleLocked(e, now) {
					break
				}
				dropped = append(dropped, h.removeLocked(e))
				h.expired++
			}
			e = prev
		}
	}
	return dropped
}

// victimLocked picks the session a new one of grant replaces: grant's least
// recently used at its cap, else, at the total cap, the least recently
// used of the grant holding the most sessions (of equals, the one whose
// least recently used is oldest).
func (h *httpSessions) victimLocked(grant string) *httpSession {
	if l := h.grants[grant]; l != nil && l.n >= h.limits.MaxPerGrant {
		return l.tail
	}
	if h.total < h.limits.MaxTotal {
		return nil
	}
	var big *grantSessionList
	for _, l := range h.grants {
		if big == nil || l.n > big.n || l.n == big.n && l.tail.last.Before(big.tail.last) {
			big = l
		}
	}
	if big == nil {
		return nil
	}
	return big.tail
}

// add mints and records a new session id for grant.
func (h *httpSessions) add(grant string) string {
	id := "mcp-session-" + rand.Text()
	now := h.now()
	h.mu.Lock()
	dropped := h.sweepLocked(now, nil)
	for h.total >= h.limits.MaxTotal || h.grants[grant] != nil && h.grants[grant].n >= h.limits.MaxPerGrant {
		v := h.victimLocked(grant)
		if v == nil {
			break
		}
		dropped = append(dropped, h.removeLocked(v))
		h.evicted++
	}
	l := h.grants[grant]
	if l == nil {
		l = &grantSessionList{grant: grant}
		h.grants[grant] = l
	}
	e := &httpSession{id: id, last: now, detach: h.attach(grant, id)}
	l.pushFront(e)
	h.byID[id] = e
	h.total++
	h.mu.Unlock()
	h.drop(dropped)
	return id
}

func (h *httpSessions) drop(ids []string) {
	if len(ids) > 0 {
		h.release(ids)
	}
}

// use reports whether id is live and belongs to grant, and marks it used.
// A session found idle is dropped.
func (h *httpSessions) use(grant, id string) bool {
	if grant == "" || id == "" {
		return false
	}
	now := h.now()
	h.mu.Lock()
	e := h.byID[id]
	if e == nil || e.list.grant != grant {
		h.mu.Unlock()
		return false
	}
	if h.idleLocked(e, now) {
		h.removeLocked(e)
		h.expired++
		h.mu.Unlock()
		h.drop([]string{id})
		return false
	}
	e.last = now
	e.list.unlink(e)
	e.list.pushFront(e)
	h.mu.Unlock()
	return true
}

// stream registers cancel as an open GET stream of grant's session id; an
// open stream keeps the session from idling out, and dropping the session
// calls cancel. done unregisters it. ok is false when the session is not
// grant's live session.
func (h *httpSessions) stream(grant, id string, cancel context.CancelFunc) (done func(), ok bool) {
	if !h.use(grant, id) {
		return nil, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.byID[id]
	if e == nil { // dropped since use
		return nil, false
	}
	key := &cancel
	if e.streams == nil {
		e.streams = map[*context.CancelFunc]struct{}{}
	}
	e.streams[key] = struct{}{}
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if e.streams != nil {
			delete(e.streams, key)
			e.last = h.now() // the stream was in use until now
		}
	}, true
}

// terminate drops id. grant "" (mcp-go's housekeeping) may drop any id;
// another grant's id is refused. An unknown id is already gone.
func (h *httpSessions) terminate(grant, id string) error {
	h.mu.Lock()
	e := h.byID[id]
	if e == nil {
		h.mu.Unlock()
		return nil
	}
	if grant != "" && e.list.grant != grant {
		h.mu.Unlock()
		return fmt.Errorf("server: http session: %w", errUnknownHTTPSession)
	}
	h.removeLocked(e)
	h.mu.Unlock()
	return nil
}

// SessionStats is what the session registry holds and has dropped.
type SessionStats struct {
	Live    int            // live sessions
	ByGrant map[string]int // live sessions per grant
	Evicted uint64         // dropped because a cap was reached
	Expired uint64         // dropped for idling
}

func (h *httpSessions) stats() SessionStats {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := SessionStats{Live: h.total, ByGrant: make(map[string]int, len(h.grants)), Evicted: h.evicted, Expired: h.expired}
	for g, l := range h.grants {
		st.ByGrant[g] = l.n
	}
	return st
}

// ResolveSessionIdManager returns the registry as the grant of r sees it;
// without a request (mcp-go's own housekeeping) a view that may terminate
// any id and validate none.
func (h *httpSessions) ResolveSessionIdManager(r *http.Request) mcpserver.SessionIdManager {
	v := grantSessions{reg: h}
	if r != nil {
		if c := server.ConnFrom(r.Context()); c != nil {
			v.grant = c.Grant.Name
		}
	}
	return v
}

// grantSessions is the registry as one grant sees it; grant "" is
// mcp-go's housekeeping.
type grantSessions struct {
	reg   *httpSessions
	grant string
}

var _ mcpserver.SessionIdManager = grantSessions{}
var _ mcpserver.SessionIdManagerResolver = (*httpSessions)(nil)

func (g grantSessions) Generate() string {
	if g.grant == "" {
		return "" // no caller to bind an id to: stateless
	}
	return g.reg.add(g.grant)
}

func (g grantSessions) Validate(id string) (isTerminated bool, err error) {
	if !g.reg.use(g.grant, id) {
		return false, fmt.Errorf("server: http session: %w", errUnknownHTTPSession)
	}
	return false, nil
}

func (g grantSessions) Terminate(id string) (isNotAllowed bool, err error) {
	return false, g.reg.terminate(g.grant, id)
}

// releaseMCPSessions frees what inner (mcp-go's streamable HTTP server)
// keeps for each dropped session id: mcp-go does that on a DELETE of the
// session, so one is sent to it directly, as housekeeping (no grant: the
// registry no longer holds the id, and Terminate of a gone id is a no-op).
func releaseMCPSessions(inner http.Handler) func(ids []string) {
	return func(ids []string) {
		for _, id := range ids {
			req, err := http.NewRequestWithContext(context.Background(), http.MethodDelete, "/mcp", http.NoBody)
			if err != nil {
				continue
			}
			req.Header.Set("Mcp-Session-Id", id)
			inner.ServeHTTP(discardResponse{h: http.Header{}}, req)
		}
	}
}

// discardResponse is the response writer of housekeeping requests.
type discardResponse struct{ h http.Header }

func (d discardResponse) Header() http.Header         { return d.h }
func (d discardResponse) Write(b []byte) (int, error) { return len(b), nil }
func (d discardResponse) WriteHeader(int)             {}

// withDefaults fills the HTTP options a config left out.
func (o Options) withDefaults() Options {
	o.Sessions = o.Sessions.withDefaults()
	if o.RequestsPerMinute <= 0 {
		o.RequestsPerMinute = DefaultRequestsPerMinute
	}
	if o.BodyTimeout <= 0 {
		o.BodyTimeout = DefaultBodyTimeout
	}
	if o.BodyBytes <= 0 {
		o.BodyBytes = DefaultBodyBytes
	}
	if o.BodyBytesPerGrant <= 0 {
		o.BodyBytesPerGrant = DefaultBodyBytesPerGrant
	}
	return o
}
