package server

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/vmgate/vmgate/internal/hostguard"
)

// ShutdownGrace is how long ServeStdio lets calls in flight finish after
// its context ends or its input closes, before it cancels them.
var ShutdownGrace = 10 * time.Second

// maxConcurrentCalls bounds the messages one stdio connection serves at once.
const maxConcurrentCalls = 64

// handle runs one message through the gate and, if the gate lets it pass,
// through mcp-go (a gated tools/call: its handler directly, dispatch.go).
// It returns the response to send (nil for none).
func (s *Server) handle(ctx context.Context, c *conn, raw []byte) (out []byte) {
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
			out = rpcError(nil, mcp.INTERNAL_ERROR, "internal error")
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
		return rpcError(nil, mcp.INTERNAL_ERROR, "cannot encode the response")
	}
	return b
}

// stdioSession is the one client of a stdio connection, as mcp-go sees it.
type stdioSession struct {
	id            string
	notifications chan mcp.JSONRPCNotification
	send          func([]byte) error // writes one message to the client
	requests      clientRequests     // requests sent to the client (elicit_legacy.go)
	mu            sync.Mutex         // guards initialized, clientInfo and clientCaps
	initialized   bool
	clientInfo    mcp.Implementation
	clientCaps    mcp.ClientCapabilities
}

func (s *stdioSession) SessionID() string { return s.id }
func (s *stdioSession) NotificationChannel() chan<- mcp.JSONRPCNotification {
	return s.notifications
}
func (s *stdioSession) Initialize() {
	s.mu.Lock()
	s.initialized = true
	s.mu.Unlock()
}
func (s *stdioSession) Initialized() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.initialized
}

var _ mcpserver.ClientSession = (*stdioSession)(nil)

// ServeStdio serves one MCP client over newline-delimited JSON-RPC on in
// and out, as the config's StdioGrant. It returns when in ends or ctx is
// done, after the calls in flight finished (or were cancelled
// ShutdownGrace later).
func (s *Server) ServeStdio(ctx context.Context, in io.Reader, out io.Writer) error {
	grant := s.stdioGrant
	g, ok := s.grants[grant]
	if !ok {
		return fmt.Errorf("server: stdio: %w %q", ErrUnknownGrant, grant)
	}
	c := &conn{grant: g, transport: "stdio"}
	sess := &stdioSession{id: "stdio-" + grant + "-" + rand.Text(), notifications: make(chan mcp.JSONRPCNotification, 64)}
	if err := s.mcp.RegisterSession(ctx, sess); err != nil {
		return fmt.Errorf("server: stdio: register session: %w", err)
	}
	defer s.mcp.UnregisterSession(context.Background(), sess.id)

	// Calls run on callCtx, which outlives ctx by the grace period.
	callCtx, cancelCalls := context.WithCancel(s.mcp.WithContext(context.WithoutCancel(ctx), sess))
	defer cancelCalls()

	lw := newLineWriter(out, s.log) // concurrent answers share write(2) calls
	write := lw.write
	sess.send = lw.send
	notifyDone := make(chan struct{})
	go forwardNotifications(callCtx, sess, write, notifyDone)

	// The calls run on the crew's members (stdiocrew.go): the member that
	// reads a call runs it, after passing the reading on. Answers to our
	// own requests and lines over the limit are dealt with by the reader
	// itself. routeMu and closed keep the reader from writing or admitting
	// anything once ServeStdio is on its way out; calls counts the calls
	// admitted, which drainStdio waits for.
	var (
		calls   sync.WaitGroup
		routeMu sync.Mutex
		closed  bool
	)
	admit := func(line []byte) (call bool, err error) {
		routeMu.Lock()
		defer routeMu.Unlock()
		if closed || ctx.Err() != nil {
			return false, errStdioClosed
		}
		switch {
		case line == nil: // a line over the limit
			write(rpcError(nil, mcp.PARSE_ERROR, "message too large"))
			return false, nil
		case sess.requests.deliver(line): // the answer to a request of ours
			return false, nil
		}
		calls.Add(1)
		return true, nil
	}
	lines := newLineReader(in, 4*s.limits.MaxMessageBytes)
	next := func() ([]byte, error) {
		for {
			line, err := lines.next()
			if err != nil {
				return nil, err
			}
			call, err := admit(line)
			if err != nil {
				return nil, err
			}
			if call {
				return line, nil
			}
		}
	}
	crew := newStdioCrew(maxConcurrentCalls, next, func(line []byte) {
		defer calls.Done()
		if resp := s.handle(callCtx, c, line); resp != nil {
			write(resp)
		}
	})
	crew.start()

	var err error
	select {
	case <-ctx.Done():
	case err = <-crew.ended():
	}
	crew.stop()
	routeMu.Lock()
	closed = true
	routeMu.Unlock()
	sess.requests.close() // requests to the client get no answer now
	s.drainStdio(&calls, cancelCalls)
	cancelCalls()
	<-notifyDone
	if errors.Is(err, io.EOF) || errors.Is(err, errStdioClosed) {
		err = nil
	}
	return err
}

// forwardNotifications writes sess's notifications with write until ctx
// is done, then closes done.
func forwardNotifications(ctx context.Context, sess *stdioSession, write func([]byte), done chan<- struct{}) {
	defer close(done)
	for {
		select {
		case n := <-sess.notifications:
			if b, err := json.Marshal(n); err == nil {
				write(b)
			}
		case <-ctx.Done():
			return
		}
	}
}

// drainStdio waits for the calls in flight (wg), cancelling them
// ShutdownGrace later.
func (s *Server) drainStdio(wg *sync.WaitGroup, cancel context.CancelFunc) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(ShutdownGrace):
		s.log.Warn("server: stdio: cancelling calls still running after the grace period")
		cancel()
		<-done
	}
}

// lineReader reads newline-delimited messages.
type lineReader struct {
	r   *bufio.Reader
	max int
}

func newLineReader(in io.Reader, max int) *lineReader {
	return &lineReader{r: bufio.NewReaderSize(in, 64<<10), max: max}
}

// next returns the next non-empty line, trimmed, or nil for a line longer
// than max (after discarding it); io.EOF when the input ends.
func (l *lineReader) next() ([]byte, error) {
	for {
		var line []byte
		tooLong := false
		for {
			frag, err := l.r.ReadSlice('\n')
			if !tooLong {
				if len(line)+len(frag) > l.max {
					tooLong, line = true, nil
				} else {
					line = append(line, frag...)
				}
			}
			if err == bufio.ErrBufferFull {
				continue
			}
			if err != nil && (len(line) == 0 && !tooLong || err != io.EOF) {
				return nil, err
			}
			break
		}
		if tooLong {
			return nil, nil
		}
		if msg := bytes.TrimSpace(line); len(msg) > 0 {
			return msg, nil
		}
	}
}

// Handler is the streamable HTTP transport at /mcp, behind the bearer
// token check and the Origin and Host checks, each grant's request budget
// (httpbudget.go) and the body read timeout (LimitBodyTime).
//
// Mcp-Session-Id values are minted by this handler and bound to the grant
// whose initialize minted them, within the bounds of httpsessions.go: an
// id it did not issue, one that was dropped (evicted, idled out,
// terminated) or one of another grant is unknown (404, and the client
// initializes again), on POST, GET and DELETE alike. 2026-07-28 clients
// need no session at all.
func (s *Server) Handler() *HTTPHandler {
	o := s.httpOpts.withDefaults()
	h := &HTTPHandler{s: s, opts: o, sessions: newHTTPSessions(s.now, o.Sessions), budget: newRequestBudget()}
	h.bodies = newBodyBytes(o.BodyBytes, o.BodyBytesPerGrant, h.maxBody()+bodyChunk)
	h.bodyWait = bodyWait
	inner := mcpserver.NewStreamableHTTPServer(s.mcp, mcpserver.WithEndpointPath("/mcp"),
		mcpserver.WithSessionIdManagerResolver(h.sessions))
	h.inner = inner
	h.sessions.release = releaseMCPSessions(inner)
	h.guarded = LimitBodyTime(http.HandlerFunc(h.serve), o.BodyTimeout)
	return h
}

// HTTPHandler serves the streamable HTTP transport; Handler makes one.
type HTTPHandler struct {
	s        *Server
	opts     HTTPOptions
	inner    http.Handler
	guarded  http.Handler
	sessions *httpSessions
	budget   *requestBudget
	bodies   *bodyBytes    // request bodies in memory (httpbody.go)
	bodyWait time.Duration // how long a body waits for room (bodyWait; tests shorten it)
}

var _ http.Handler = (*HTTPHandler)(nil)

// SessionStats reports the sessions the handler holds and has dropped.
func (h *HTTPHandler) SessionStats() HTTPSessionStats { return h.sessions.stats() }

func (h *HTTPHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.guarded.ServeHTTP(w, r) }

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
func (h *HTTPHandler) serve(w http.ResponseWriter, r *http.Request) {
	s := h.s
	if !s.hostAllowed(r.Host) {
		httpError(w, http.StatusForbidden, "forbidden: Host not allowed")
		return
	}
	if !originAllowed(r, s.httpOpts.AllowedOrigins) {
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
	g := s.grantForToken(auth)
	if g == nil {
		w.Header().Set("WWW-Authenticate", `Bearer realm="vmgate"`)
		httpError(w, http.StatusUnauthorized, "unauthorized")
		return
	}
	c := &conn{grant: g, transport: "http"}
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
func (h *HTTPHandler) serveOther(w http.ResponseWriter, r *http.Request, c *conn) {
	ctx := withConn(r.Context(), c)
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
			done, ok := h.sessions.stream(c.grant.Name, sid, cancel)
			if !ok {
				httpError(w, http.StatusNotFound, msgSessionGone)
				return
			}
			defer done()
		} else if !h.sessions.use(c.grant.Name, sid) {
			httpError(w, http.StatusNotFound, msgSessionGone)
			return
		}
	}
	h.inner.ServeHTTP(w, r.WithContext(ctx))
}

// servePost reads a POST's message (its request already taken from the
// grant's budget; within the body bounds of httpbody.go), checks its
// session and passes it through the gate to mcp-go.
func (h *HTTPHandler) servePost(w http.ResponseWriter, r *http.Request, c *conn) {
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
	v := s.gateMessage(r.Context(), c, body)
	if v.ctx == nil {
		if v.reply == nil {
			w.WriteHeader(http.StatusAccepted)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(v.reply)
		return
	}
	if v.t != nil {
		defer s.settle(v.t)
	}
	r2 := r.WithContext(v.ctx)
	r2.Body = io.NopCloser(bytes.NewReader(body))
	r2.ContentLength = int64(len(body))
	h.inner.ServeHTTP(w, r2)
}

// sessionOK checks the session of a POST before the gate sees its message:
// a message of a client older than 2026-07-28, other than initialize, that
// names a session must name a live session of the caller's grant; it is
// refused (404) otherwise, without reaching the gate: it is no call of any
// session this handler holds. A message that names none goes through the
// gate (a malformed call is refused and audited as always) and mcp-go
// refuses what passes it.
func (h *HTTPHandler) sessionOK(w http.ResponseWriter, r *http.Request, c *conn, body []byte) bool {
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
	if !h.sessions.use(c.grant.Name, sid) {
		httpError(w, http.StatusNotFound, msgSessionGone)
		return false
	}
	return true
}

// grantForToken finds the grant of the one bearer token in auth. Every
// grant's hash is compared, in constant time, whatever matches.
func (s *Server) grantForToken(auth []string) *Grant {
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

// hostAllowed accepts loopback hosts (with any port) and the configured ones.
func (s *Server) hostAllowed(host string) bool {
	return hostguard.Allowed(host, s.httpOpts.AllowedHosts)
}
