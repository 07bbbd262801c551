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
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
)

// ShutdownGrace is how long ServeStdio lets calls in flight finish after
// its context ends or its input closes, before it cancels them.
var ShutdownGrace = 10 * time.Second

// maxConcurrentCalls bounds the messages one stdio connection serves at once.
const maxConcurrentCalls = 64

// handle runs one message through the gate and, if the gate lets it pass,
// through mcp-go. It returns the response to send (nil for none).
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
	resp := s.mcp.HandleMessage(v.ctx, raw)
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

	var wmu sync.Mutex // wmu serialises writes to out
	var writeErr error
	write := func(b []byte) {
		wmu.Lock()
		defer wmu.Unlock()
		if writeErr != nil {
			return
		}
		b = append(b, '\n')
		if _, err := out.Write(b); err != nil {
			writeErr = err
			s.log.Warn("server: stdio: write failed", "err", err)
		}
	}
	sess.send = func(b []byte) error {
		write(b)
		wmu.Lock()
		defer wmu.Unlock()
		return writeErr
	}
	notifyDone := make(chan struct{})
	go func() {
		defer close(notifyDone)
		for {
			select {
			case n := <-sess.notifications:
				if b, err := json.Marshal(n); err == nil {
					write(b)
				}
			case <-callCtx.Done():
				return
			}
		}
	}()

	lines := make(chan []byte)
	readErr := make(chan error, 1)
	go func() {
		readErr <- readLines(in, 4*s.limits.MaxMessageBytes, lines, callCtx.Done())
	}()

	var wg sync.WaitGroup
	sem := make(chan struct{}, maxConcurrentCalls)
	var err error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case err = <-readErr:
			break loop
		case line := <-lines:
			if line == nil { // a line over the limit
				write(rpcError(nil, mcp.PARSE_ERROR, "message too large"))
				continue
			}
			if sess.requests.deliver(line) { // the answer to a request of ours
				continue
			}
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				break loop
			}
			wg.Go(func() {
				defer func() { <-sem }()
				if resp := s.handle(callCtx, c, line); resp != nil {
					write(resp)
				}
			})
		}
	}
	sess.requests.close() // requests to the client get no answer now
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(ShutdownGrace):
		s.log.Warn("server: stdio: cancelling calls still running after the grace period")
		cancelCalls()
		<-done
	}
	cancelCalls()
	<-notifyDone
	if errors.Is(err, io.EOF) {
		err = nil
	}
	return err
}

// readLines sends every non-empty line of in to lines (a line longer than
// max as nil, after discarding it) until in ends or stop is closed.
func readLines(in io.Reader, max int, lines chan<- []byte, stop <-chan struct{}) error {
	r := bufio.NewReaderSize(in, 64<<10)
	for {
		var line []byte
		tooLong := false
		for {
			frag, err := r.ReadSlice('\n')
			if !tooLong {
				if len(line)+len(frag) > max {
					tooLong, line = true, nil
				} else {
					line = append(line, frag...)
				}
			}
			if err == bufio.ErrBufferFull {
				continue
			}
			if err != nil && (len(line) == 0 && !tooLong || err != io.EOF) {
				return err
			}
			break
		}
		var msg []byte
		if !tooLong {
			msg = bytes.TrimSpace(line)
			if len(msg) == 0 {
				continue
			}
		}
		select {
		case lines <- msg:
		case <-stop:
			return nil
		}
	}
}

// Handler is the streamable HTTP transport at /mcp, behind the bearer
// token check and the Origin and Host checks.
//
// Mcp-Session-Id values are minted by this handler and bound to the grant
// whose initialize minted them: an id it did not issue, one that idled out
// or one of another grant is unknown (404, and the client initializes
// again), on POST, GET and DELETE alike.
func (s *Server) Handler() http.Handler {
	sessions := &httpSessions{now: s.now, owner: map[string]*httpSession{}}
	inner := mcpserver.NewStreamableHTTPServer(s.mcp, mcpserver.WithEndpointPath("/mcp"),
		mcpserver.WithSessionIdManagerResolver(sessions))
	return &httpHandler{s: s, inner: inner, sessions: sessions}
}

type httpHandler struct {
	s        *Server
	inner    http.Handler
	sessions *httpSessions
}

// HTTPSessionIdle is how long an HTTP session id lives without a request;
// after that it is unknown and the client initializes again.
var HTTPSessionIdle = 24 * time.Hour

// httpSessionPruneAt: the registry drops idle ids when it holds more.
const httpSessionPruneAt = 1024

// errUnknownHTTPSession: a session id this handler did not issue to the
// caller's grant (or one that idled out or was terminated).
var errUnknownHTTPSession = errors.New("unknown session")

// httpSessions is the registry of the session ids the HTTP transport
// issued; it is mcp-go's session id manager, resolved per request to the
// caller's grant. mu guards owner and pruned.
type httpSessions struct {
	now    func() time.Time
	mu     sync.Mutex
	owner  map[string]*httpSession
	pruned time.Time
}

type httpSession struct {
	grant string
	last  time.Time
}

// ResolveSessionIdManager returns the registry as the grant of r sees it;
// without a request (mcp-go's own housekeeping) a view that may terminate
// any id and validate none.
func (h *httpSessions) ResolveSessionIdManager(r *http.Request) mcpserver.SessionIdManager {
	v := grantSessions{reg: h}
	if r != nil {
		if c := connFrom(r.Context()); c != nil {
			v.grant = c.grant.Name
		}
	}
	return v
}

// owns reports whether id is live and belongs to grant, and marks it used.
func (h *httpSessions) owns(grant, id string) bool {
	if grant == "" || id == "" {
		return false
	}
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.owner[id]
	if e == nil || e.grant != grant {
		return false
	}
	if now.Sub(e.last) > HTTPSessionIdle {
		delete(h.owner, id)
		return false
	}
	e.last = now
	return true
}

// addLocked records a new id; it drops idled-out ids once the registry
// holds more than httpSessionPruneAt, at most once per minute.
func (h *httpSessions) addLocked(id, grant string, now time.Time) {
	if len(h.owner) >= httpSessionPruneAt && now.Sub(h.pruned) > time.Minute {
		h.pruned = now
		for k, e := range h.owner {
			if now.Sub(e.last) > HTTPSessionIdle {
				delete(h.owner, k)
			}
		}
	}
	h.owner[id] = &httpSession{grant: grant, last: now}
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
	id := "mcp-session-" + rand.Text()
	now := g.reg.now()
	g.reg.mu.Lock()
	g.reg.addLocked(id, g.grant, now)
	g.reg.mu.Unlock()
	return id
}

func (g grantSessions) Validate(id string) (isTerminated bool, err error) {
	if !g.reg.owns(g.grant, id) {
		return false, fmt.Errorf("server: http session: %w", errUnknownHTTPSession)
	}
	return false, nil
}

func (g grantSessions) Terminate(id string) (isNotAllowed bool, err error) {
	g.reg.mu.Lock()
	defer g.reg.mu.Unlock()
	e := g.reg.owner[id]
	if e == nil {
		return false, nil // already gone: idempotent
	}
	if g.grant != "" && e.grant != g.grant {
		return false, fmt.Errorf("server: http session: %w", errUnknownHTTPSession)
	}
	delete(g.reg.owner, id)
	return false, nil
}

func httpError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	fmt.Fprintln(w, msg)
}

func (h *httpHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s := h.s
	if !s.hostAllowed(r.Host) {
		httpError(w, http.StatusForbidden, "forbidden: Host not allowed")
		return
	}
	if o := r.Header.Values("Origin"); len(o) > 1 || len(o) == 1 && !slices.Contains(s.httpOpts.AllowedOrigins, o[0]) {
		httpError(w, http.StatusForbidden, "forbidden: Origin not allowed")
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
	if r.Method != http.MethodPost {
		// mcp-go does not check the session of a GET (it would open a
		// stream on any id, another grant's included) and answers a DELETE
		// of another grant's id with a 500: both are checked here. A
		// 2026-07-28 client has no sessions; mcp-go refuses its GET and DELETE.
		if (r.Method == http.MethodGet || r.Method == http.MethodDelete) && !mcp.IsModernProtocol(r.Header.Get("Mcp-Protocol-Version")) {
			sid := r.Header.Get("Mcp-Session-Id")
			if sid == "" {
				httpError(w, http.StatusBadRequest, "Mcp-Session-Id required; initialize first")
				return
			}
			if !h.sessions.owns(g.Name, sid) {
				httpError(w, http.StatusNotFound, "unknown session; initialize again")
				return
			}
		}
		h.inner.ServeHTTP(w, r.WithContext(withConn(r.Context(), c)))
		return
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		httpError(w, http.StatusUnsupportedMediaType, "Content-Type must be application/json")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(4*s.limits.MaxMessageBytes)))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			httpError(w, http.StatusRequestEntityTooLarge, "message too large")
			return
		}
		httpError(w, http.StatusBadRequest, "cannot read the request body")
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
	h, _, err := net.SplitHostPort(host)
	if err != nil {
		h = host
	}
	h = strings.Trim(h, "[]")
	if strings.EqualFold(h, "localhost") {
		return true
	}
	if ip, err := netip.ParseAddr(h); err == nil && ip.IsLoopback() {
		return true
	}
	return slices.ContainsFunc(s.httpOpts.AllowedHosts, func(a string) bool {
		return strings.EqualFold(a, host) || strings.EqualFold(a, h)
	})
}
