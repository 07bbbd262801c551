// Package mcphttp is vmgate's streamable HTTP transport at /mcp: the
// bearer token names the grant (server.GrantForToken); the Host and Origin
// are checked against DNS rebinding (guard.go); each grant has a request
// budget (budget.go); request bodies are bounded before they are read, in
// size, in time and in memory held at once (body.go, LimitBodyTime); the
// sessions of clients before protocol 2026-07-28 are bound to their grant
// and bounded (sessions.go). Every message goes through the gate
// (server.Admit) before mcp-go's streamable HTTP server serves it.
//
// Only cmd/vmgate imports it.
package mcphttp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/vmgate/vmgate/internal/hostguard"
	"github.com/vmgate/vmgate/server"
)

// Options configure New.
type Options struct {
	// AllowedOrigins are the Origin values (scheme://host[:port]) a browser
	// may send besides loopback origins on a loopback address
	// (originAllowed, guard.go); a request with any other Origin gets
	// 403. Requests without Origin (non-browser clients) are allowed.
	AllowedOrigins []string
	// AllowedHosts are the Host header values accepted besides loopback
	// names (localhost, 127.0.0.1, [::1]) with any port; others get 403.
	AllowedHosts []string
	// Sessions bound the HTTP sessions (sessions.go).
	Sessions SessionLimits
	// RequestsPerMinute is each grant's request budget (budget.go;
	// default DefaultRequestsPerMinute); Grant.RequestsPerMinute
	// overrides it.
	RequestsPerMinute int
	// BodyTimeout bounds how long a client takes to send a request body
	// (default DefaultBodyTimeout).
	BodyTimeout time.Duration
	// BodyBytes and BodyBytesPerGrant bound the request bodies held in
	// memory at once, in all and per grant (body.go; defaults
	// DefaultBodyBytes, DefaultBodyBytesPerGrant; both at least
	// the largest body a message may have).
	BodyBytes, BodyBytesPerGrant int64
}

// New is the streamable HTTP transport of s at /mcp, behind the bearer
// token check and the Origin and Host checks, each grant's request budget
// (budget.go), the bounds on request bodies (body.go) and the body read
// timeout (LimitBodyTime).
//
// Mcp-Session-Id values are minted by this handler and bound to the grant
// whose initialize minted them, within the bounds of httpsessions.go: an
// id it did not issue, one that was dropped (evicted, idled out,
// terminated) or one of another grant is unknown (404, and the client
// initializes again), on POST, GET and DELETE alike (sessions.go).
// 2026-07-28 clients need no session at all.
func New(s *server.Server, o Options) *Handler {
	o = o.withDefaults()
	h := &Handler{s: s, opts: o, sessions: newHTTPSessions(s.Now, o.Sessions), budget: newRequestBudget()}
	h.bodies = newBodyBytes(o.BodyBytes, o.BodyBytesPerGrant, h.maxBody()+bodyChunk)
	h.bodyWait = bodyWait
	inner := mcpserver.NewStreamableHTTPServer(s.MCP(), mcpserver.WithEndpointPath("/mcp"),
		mcpserver.WithSessionIdManagerResolver(h.sessions))
	h.inner = inner
	h.sessions.release = releaseMCPSessions(inner)
	h.sessions.attach = s.AttachSession
	h.guarded = LimitBodyTime(http.HandlerFunc(h.serve), o.BodyTimeout)
	return h
}

// Handler serves the streamable HTTP transport; New makes one.
type Handler struct {
	s        *server.Server
	opts     Options
	inner    http.Handler
	guarded  http.Handler
	sessions *httpSessions
	budget   *requestBudget
	bodies   *bodyBytes    // request bodies in memory (body.go)
	bodyWait time.Duration // how long a body waits for room (bodyWait; tests shorten it)
}

var _ http.Handler = (*Handler)(nil)

// SessionStats reports the sessions the handler holds and has dropped.
func (h *Handler) SessionStats() SessionStats { return h.sessions.stats() }

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.guarded.ServeHTTP(w, r) }

func httpError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	fmt.Fprintln(w, msg)
}

// msgSessionGone answers a request in a session this handler does not hold
// for the caller's grant.
const msgSessionGone = "session expired or unknown: initialize again (sessions end after an idle time, or when their grant opens more than its cap)"

// serve checks who is calling and how, then hands the request on.
func (h *Handler) serve(w http.ResponseWriter, r *http.Request) {
	s := h.s
	if !hostguard.Allowed(r.Host, h.opts.AllowedHosts) {
		httpError(w, http.StatusForbidden, "forbidden: Host not allowed")
		return
	}
	if !originAllowed(r, h.opts.AllowedOrigins) {
		httpError(w, http.StatusForbidden, "forbidden: Origin not allowed (a loopback origin is accepted on a loopback listener; list others in http.allowed_origins)")
		return
	}
	q := r.URL.Query()
	for _, k := range []string{"access_token", "token", "auth", "authorization", "bearer"} {
		if q.Has(k) {
			httpError(w, http.StatusBadRequest, "tokens are not accepted in the query string; use the Authorization header")
			return
		}
	}
	auth := r.Header.Values("Authorization")
	if len(auth) > 1 {
		httpError(w, http.StatusBadRequest, "more than one Authorization header")
		return
	}
	g := s.GrantForToken(auth)
	if g == nil {
		w.Header().Set("WWW-Authenticate", `Bearer realm="vmgate"`)
		httpError(w, http.StatusUnauthorized, "unauthorized")
		return
	}
	c := &server.Conn{Grant: g, Transport: "http"}
	if sid := r.Header.Values("Mcp-Session-Id"); len(sid) > 1 {
		httpError(w, http.StatusBadRequest, "more than one Mcp-Session-Id header")
		return
	}
	if !h.admit(w, r, c) {
		return
	}
	if r.Method != http.MethodPost {
		h.serveOther(w, r, c)
		return
	}
	h.servePost(w, r, c)
}

// serveOther serves GET (the stream of server messages), DELETE (the end
// of a session) and anything else mcp-go answers.
func (h *Handler) serveOther(w http.ResponseWriter, r *http.Request, c *server.Conn) {
	ctx := server.ConnContext(r.Context(), c)
	// mcp-go does not check the session of a GET (it would open a stream on
	// any id, another grant's included) and answers a DELETE of another
	// grant's id with a 500: both are checked here. A 2026-07-28 client has
	// no sessions; mcp-go refuses its GET and DELETE.
	if (r.Method == http.MethodGet || r.Method == http.MethodDelete) && !mcp.IsModernProtocol(r.Header.Get("Mcp-Protocol-Version")) {
		sid := r.Header.Get("Mcp-Session-Id")
		if sid == "" {
			httpError(w, http.StatusBadRequest, "Mcp-Session-Id required; initialize first")
			return
		}
		if r.Method == http.MethodGet {
			// The stream keeps its session from idling out, and ends
			// when the session is dropped.
			var cancel context.CancelFunc
			ctx, cancel = context.WithCancel(ctx)
			defer cancel()
			done, ok := h.sessions.stream(c.Grant.Name, sid, cancel)
			if !ok {
				httpError(w, http.StatusNotFound, msgSessionGone)
				return
			}
			defer done()
		} else if !h.sessions.use(c.Grant.Name, sid) {
			httpError(w, http.StatusNotFound, msgSessionGone)
			return
		}
	}
	h.inner.ServeHTTP(w, r.WithContext(ctx))
}

// servePost reads a POST's message (its request already taken from the
// grant's budget; within the body bounds of body.go), checks its
// session and passes it through the gate to mcp-go.
func (h *Handler) servePost(w http.ResponseWriter, r *http.Request, c *server.Conn) {
	s := h.s
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		httpError(w, http.StatusUnsupportedMediaType, "Content-Type must be application/json")
		return
	}
	body, hold, ok := h.readBody(w, r, c)
	if !ok {
		return
	}
	defer hold.release()
	if !h.sessionOK(w, r, c, body) {
		return
	}
	a := s.Admit(r.Context(), c, body)
	defer a.Done()
	ctx := a.Context()
	if ctx == nil {
		if a.Reply() == nil {
			w.WriteHeader(http.StatusAccepted)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(a.Reply())
		return
	}
	r2 := r.WithContext(ctx)
	r2.Body = io.NopCloser(bytes.NewReader(body))
	r2.ContentLength = int64(len(body))
	h.inner.ServeHTTP(w, r2)
}

// sessionOK checks the session of a POST before the gate sees its message:
// a message of a client older than 2026-07-28, other than initialize, that
// names a session must name a live session of the caller's grant (which
// then becomes c's Session, where the gate's notifications about the call
// go); it is refused (404) otherwise, without reaching the gate: it is no
// call of any session this handler holds. A message that names none goes through the
// gate (a malformed call is refused and audited as always) and mcp-go
// refuses what passes it.
func (h *Handler) sessionOK(w http.ResponseWriter, r *http.Request, c *server.Conn, body []byte) bool {
	if mcp.IsModernProtocol(r.Header.Get("Mcp-Protocol-Version")) {
		return true
	}
	var peek struct {
		Method string `json:"method"`
		Params struct {
			Meta *mcp.Meta `json:"_meta"`
		} `json:"params"`
	}
	if json.Unmarshal(body, &peek) != nil {
		return true // not a message mcp-go will read: the gate answers it
	}
	if peek.Method == string(mcp.MethodInitialize) || mcp.IsModernProtocol(peek.Params.Meta.ProtocolVersion()) {
		return true
	}
	sid := r.Header.Get("Mcp-Session-Id")
	if sid == "" {
		return true
	}
	if !h.sessions.use(c.Grant.Name, sid) {
		httpError(w, http.StatusNotFound, msgSessionGone)
		return false
	}
	c.Session = sid
	return true
}
