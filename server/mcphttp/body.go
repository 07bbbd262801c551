package mcphttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/vmgate/vmgate/server"
	"github.com/vmgate/vmgate/server/catalog"
)

// The request bodies of the streamable HTTP transport, bounded before they
// are read. A POST's body is read only after its token was checked and its
// request took a unit of its grant's budget (httpbudget.go), and then:
//
//   - at most the message limit (Limits.MaxMessageBytes, 8 MiB) plus
//     bodySlack is read. A Content-Length beyond it is refused with 413
//     before a byte of the body is read; a body without one (chunked) is
//     refused with 413 as soon as it passes the bound (what the client
//     still sends after a refusal is discarded for a moment, so that it
//     reads the refusal: lingerBody). The slack lets a message a little
//     over the limit reach the gate, which refuses it as an audited
//     [INVALID ARGUMENT] naming the limit;
//   - the bytes of bodies held in memory are bounded in all
//     (Options.BodyBytes) and per grant (Options.BodyBytesPerGrant).
//     A body takes its Content-Length from both before it is read (one
//     without takes the whole bound while it is read, and what it did not
//     use is given back once it is in), and gives it back when its request
//     has been answered. A request whose body does not fit waits up to
//     bodyWait for room, then is refused without being read: 429 when its
//     grant's own share is full (the grant sends too much at once), 503
//     when the server's is (the server is busy); both with Retry-After;
//   - a body is read into one buffer of its Content-Length (one without
//     into pooled chunks, copied once into a buffer of its length at its
//     end, so a body refused as too large leaves nothing behind); nothing
//     keeps it once the request is answered.
//
// So whatever clients send, the server holds at most BodyBytes of request
// bodies at once (the message's decoded form and mcp-go's copy come on top,
// in proportion), and one grant at most BodyBytesPerGrant of them, so one
// grant cannot take the others' share.

// Defaults of the body bounds (Options.BodyBytes, BodyBytesPerGrant).
const (
	DefaultBodyBytes         = 32 << 20
	DefaultBodyBytesPerGrant = 16 << 20
)

// bodySlack is how far past the message limit a body is read, so that a
// message a little too large is refused by the gate, with its id and an
// audit record, rather than by the transport.
const bodySlack = 64 << 10

// bodyWait is how long a request waits for room for its body.
const bodyWait = 2 * time.Second

// bodyPeekBytes is how much of a body a request refused by its grant's
// budget may still read, to answer a tools/call with a tool result.
const bodyPeekBytes = 4 << 10

// errBodiesFull and errGrantBodiesFull: no room for a body, in all or in
// its grant's share, within bodyWait.
var (
	errBodiesFull      = errors.New("the server holds as many request bodies as it may")
	errGrantBodiesFull = errors.New("the grant has as many request bodies in flight as it may")
	errBodyTooLarge    = errors.New("request body too large")
)

// bodyBytes counts the bytes of the request bodies in memory, in all and
// per grant. Concurrency: mu guards the counts and wake; a waiter holds
// nothing while it waits, so waiting cannot deadlock.
type bodyBytes struct {
	total, perGrant int64

	mu      sync.Mutex
	used    int64
	grants  map[string]int64
	waiting int           // requests waiting for room
	wake    chan struct{} // closed (and replaced) whenever bytes are given back
	refused int           // refusals since the last log line
	logged  time.Time     // when the last refusal was logged
}

// logNow counts a refusal and reports whether to log it (the first of a
// minute), with the number refused since the last line: a flood of
// refusals must not become a flood of log lines.
func (b *bodyBytes) logNow(now time.Time) (int, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refused++
	if now.Sub(b.logged) < time.Minute {
		return 0, false
	}
	n := b.refused
	b.logged, b.refused = now, 0
	return n, true
}

// newBodyBytes bounds bodies to total in all and perGrant per grant; both
// are raised to at least largest, the largest body, so that every body
// fits.
func newBodyBytes(total, perGrant, largest int64) *bodyBytes {
	perGrant = max(perGrant, largest)
	return &bodyBytes{total: max(total, perGrant), perGrant: perGrant, grants: map[string]int64{}, wake: make(chan struct{})}
}

// bodyHold is the share of a body; release gives it back (once).
type bodyHold struct {
	b     *bodyBytes
	grant string
	n     int64
}

// tryTake takes n bytes for grant if they fit, or says which bound is
// full and what to wait on.
func (b *bodyBytes) tryTake(grant string, n int64) (wake <-chan struct{}, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.grants[grant]+n > b.perGrant:
		return b.wake, errGrantBodiesFull
	case b.used+n > b.total:
		return b.wake, errBodiesFull
	}
	b.used += n
	b.grants[grant] += n
	return nil, nil
}

// take takes n bytes for grant, waiting up to wait (or until ctx ends) for
// room.
func (b *bodyBytes) take(ctx context.Context, grant string, n int64, wait time.Duration) (*bodyHold, error) {
	wake, err := b.tryTake(grant, n)
	if err == nil {
		return &bodyHold{b: b, grant: grant, n: n}, nil
	}
	b.countWaiting(1)
	defer b.countWaiting(-1)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		select {
		case <-wake:
		case <-timer.C:
			return nil, err
		case <-ctx.Done():
			return nil, err
		}
		if wake, err = b.tryTake(grant, n); err == nil {
			return &bodyHold{b: b, grant: grant, n: n}, nil
		}
	}
}

func (b *bodyBytes) countWaiting(d int) {
	b.mu.Lock()
	b.waiting += d
	b.mu.Unlock()
}

// giveBack returns n bytes of grant and wakes the waiters.
func (b *bodyBytes) giveBack(grant string, n int64) {
	if n <= 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
	if b.grants[grant] -= n; b.grants[grant] <= 0 {
		delete(b.grants, grant)
	}
	close(b.wake)
	b.wake = make(chan struct{})
}

// shrink keeps only n bytes of the hold.
func (h *bodyHold) shrink(n int64) {
	if n < h.n {
		h.b.giveBack(h.grant, h.n-n)
		h.n = n
	}
}

func (h *bodyHold) release() { h.shrink(0) }

// inUse reports the bytes held in all and by grant, and how many requests
// wait for room.
func (b *bodyBytes) inUse(grant string) (all, mine int64, waiting int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used, b.grants[grant], b.waiting
}

// maxBody is the most a POST's body may hold.
func (h *Handler) maxBody() int64 { return int64(h.s.MaxMessageBytes()) + bodySlack }

// readBody reads r's body within the bounds above. ok false: r has been
// answered. Otherwise the caller releases hold once r is answered.
func (h *Handler) readBody(w http.ResponseWriter, r *http.Request, c *server.Conn) (body []byte, hold *bodyHold, ok bool) {
	limit := h.maxBody()
	if r.ContentLength > limit {
		refuseTooLarge(w, h.s.MaxMessageBytes())
		lingerBody(w, r)
		return nil, nil, false
	}
	want := r.ContentLength
	if want < 0 {
		want = limit + bodyChunk // its chunks, the last one perhaps not full
	}
	hold, err := h.bodies.take(r.Context(), c.Grant.Name, want, h.bodyWait)
	if err != nil {
		h.refuseBodyRoom(w, c, err)
		lingerBody(w, r)
		return nil, nil, false
	}
	body, err = readLimited(r.Body, r.ContentLength, limit)
	if err != nil {
		hold.release()
		switch {
		case errors.Is(err, errBodyTooLarge):
			refuseTooLarge(w, h.s.MaxMessageBytes())
			lingerBody(w, r)
		case bodyTimedOut(err):
			w.Header().Set("Connection", "close")
			httpError(w, http.StatusRequestTimeout, fmt.Sprintf("the request body did not arrive within %v", h.opts.BodyTimeout))
		default:
			httpError(w, http.StatusBadRequest, "cannot read the request body")
		}
		return nil, nil, false
	}
	hold.shrink(int64(len(body)))
	return body, hold, true
}

// refuseTooLarge answers a body over the bound; the connection is closed
// rather than the rest of the body read.
func refuseTooLarge(w http.ResponseWriter, limit int) {
	w.Header().Set("Connection", "close")
	httpError(w, http.StatusRequestEntityTooLarge,
		fmt.Sprintf("message too large: a message may hold at most %d bytes; send less at once (a large file in parts: vm_file_write with offset or append)", limit))
}

// refuseBodyRoom answers a request whose body found no room.
func (h *Handler) refuseBodyRoom(w http.ResponseWriter, c *server.Conn, err error) {
	w.Header().Set("Retry-After", "1")
	w.Header().Set("Connection", "close")
	all, mine, _ := h.bodies.inUse(c.Grant.Name)
	if n, ok := h.bodies.logNow(h.s.Now()); ok {
		h.s.Logger().Warn("server: http: request bodies at their bound; requests refused", "grant", c.Grant.Name,
			"grant_bytes", mine, "all_bytes", all, "refused_since_last_log", n)
	}
	if errors.Is(err, errGrantBodiesFull) {
		httpError(w, http.StatusTooManyRequests, fmt.Sprintf("%s grant %s has %d bytes of request bodies in flight, the most one grant may: retry in 1 s, or send fewer large requests at once",
			catalog.TagRateLimited, c.Grant.Name, h.bodies.perGrant))
		return
	}
	httpError(w, http.StatusServiceUnavailable, fmt.Sprintf("the server holds %d bytes of request bodies, the most it may: retry in 1 s", h.bodies.total))
}

// readLimited reads rd to its end into one buffer of its length: of size
// bytes when size is known (>= 0), else gathered in pooled chunks and
// copied once into a buffer of the length found. A body longer than limit
// (or than size) is errBodyTooLarge, found without reading more than one
// byte past the bound.
func readLimited(rd io.Reader, size, limit int64) ([]byte, error) {
	if size < 0 {
		return readChunks(io.LimitReader(rd, limit+1), limit)
	}
	buf := make([]byte, size)
	if _, err := io.ReadFull(rd, buf); err != nil {
		return nil, err
	}
	// One byte more: the end (and, behind LimitBodyTime, the read
	// deadline cleared), or a body longer than it said.
	var one [1]byte
	switch n, err := io.ReadFull(rd, one[:]); {
	case n > 0:
		return nil, errBodyTooLarge
	case errors.Is(err, io.EOF):
		return buf, nil
	default:
		return nil, err
	}
}

// bodyChunk is the size of the pooled chunks a body of unknown length is
// read into.
const bodyChunk = 64 << 10

// bodyChunks holds the chunks between two bodies.
var bodyChunks = sync.Pool{New: func() any { b := make([]byte, bodyChunk); return &b }}

// readChunks reads rd (which ends at most one byte past limit) to its end.
func readChunks(rd io.Reader, limit int64) ([]byte, error) {
	var chunks []*[]byte
	defer func() {
		for _, c := range chunks {
			if c != nil {
				bodyChunks.Put(c)
			}
		}
	}()
	n := int64(0)
	for {
		c := bodyChunks.Get().(*[]byte)
		chunks = append(chunks, c)
		m, err := io.ReadFull(rd, *c)
		n += int64(m)
		if n > limit {
			return nil, errBodyTooLarge
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	// Each chunk goes back to the pool once copied: the body and its
	// chunks are never both held whole.
	out := make([]byte, 0, n)
	for i, c := range chunks {
		out = append(out, (*c)[:min(int64(len(*c)), n-int64(len(out)))]...)
		bodyChunks.Put(c)
		chunks[i] = nil
	}
	chunks = nil
	return out, nil
}

// Lingering: a client that sends its whole body before it reads the
// answer (most do) would find the connection reset, the answer lost, if
// the server closed it on a body it did not read. So after answering such
// a request, the server reads and discards what the client still sends,
// for at most lingerFor and lingerBytes (as nginx's lingering close),
// keeping none of it, then closes the connection.
const (
	lingerFor   = 2 * time.Second
	lingerBytes = 64 << 20
)

// lingerBody sends the answer written to w, then discards r's body within
// the lingering bounds. Only on a real connection: a writer without read
// deadlines (a test's recorder) gets no lingering.
func lingerBody(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	if err := rc.SetReadDeadline(time.Now().Add(lingerFor)); err != nil {
		return
	}
	_ = rc.Flush()
	if _, err := io.CopyN(io.Discard, r.Body, lingerBytes); errors.Is(err, io.EOF) {
		// All of it came: the connection may serve another request.
		_ = rc.SetReadDeadline(time.Time{})
	}
}

// peekBody reads r's body if it holds at most bodyPeekBytes, for the
// answer to a refused request; nil if it holds more, or cannot be read.
func peekBody(r *http.Request) []byte {
	if r.ContentLength > bodyPeekBytes {
		return nil
	}
	b, err := readLimited(r.Body, r.ContentLength, bodyPeekBytes)
	if err != nil {
		return nil
	}
	return b
}
