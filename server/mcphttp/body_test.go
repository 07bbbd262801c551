package mcphttp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmgate/vmgate/server/catalog"
	"github.com/vmgate/vmgate/server/mcptest"
	"github.com/vmgate/vmgate/server/servertest"
)

// countingReader counts what is read of r.
type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// endless is an endless body of 'x'.
type endless struct{}

func (endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	return len(p), nil
}

func TestReadLimited(t *testing.T) {
	big := strings.Repeat("y", 3*bodyChunk+17)
	tests := []struct {
		name        string
		body        io.Reader
		size, limit int64
		want        string
		wantErr     error
		maxRead     int64 // most bytes it may read; 0: the body's length
	}{
		{"known size", strings.NewReader("hello"), 5, 10, "hello", nil, 0},
		{"known size, empty", strings.NewReader(""), 0, 10, "", nil, 0},
		{"longer than its size", strings.NewReader("hello"), 3, 10, "", errBodyTooLarge, 4},
		{"shorter than its size", strings.NewReader("hello"), 10, 10, "", io.ErrUnexpectedEOF, 5},
		{"unknown size", strings.NewReader("hello"), -1, 10, "hello", nil, 0},
		{"unknown size, empty", strings.NewReader(""), -1, 10, "", nil, 0},
		{"unknown size, at the limit", strings.NewReader("hello"), -1, 5, "hello", nil, 0},
		{"unknown size, one past the limit", strings.NewReader("hello"), -1, 4, "", errBodyTooLarge, 5},
		{"unknown size, several chunks", strings.NewReader(big), -1, 4 * bodyChunk, big, nil, 0},
		{"unknown size, endless", endless{}, -1, 2*bodyChunk + 5, "", errBodyTooLarge, 2*bodyChunk + 6},
	}
	for _, tt := range tests {
		cr := &countingReader{r: tt.body}
		got, err := readLimited(cr, tt.size, tt.limit)
		if string(got) != tt.want || !errors.Is(err, tt.wantErr) {
			t.Errorf("%s: readLimited = %d bytes, %v; want %d bytes, %v", tt.name, len(got), err, len(tt.want), tt.wantErr)
		}
		if max := tt.maxRead; max > 0 && cr.n.Load() > max {
			t.Errorf("%s: read %d bytes; want at most %d", tt.name, cr.n.Load(), max)
		}
		if err == nil && int64(cap(got)) != int64(len(got)) {
			t.Errorf("%s: buffer of %d bytes for a body of %d; want one of its length", tt.name, cap(got), len(got))
		}
	}
}

// Whatever many takers ask, the bytes held never pass either bound, a
// taker that finds no room within its wait is refused with the bound that
// was full, and every byte comes back.
func TestBodyBytesBounds(t *testing.T) {
	b := newBodyBytes(100, 60, 10)
	if b.total != 100 || b.perGrant != 60 {
		t.Fatalf("bounds %d, %d; want 100, 60", b.total, b.perGrant)
	}
	if r := newBodyBytes(1, 1, 30); r.total != 30 || r.perGrant != 30 {
		t.Errorf("bounds below the largest body = %d, %d; want both raised to 30", r.total, r.perGrant)
	}
	ctx := context.Background()
	a, err := b.take(ctx, "a", 60, 0)
	if err != nil {
		t.Fatalf("take 60 of 60: %v", err)
	}
	if _, err := b.take(ctx, "a", 1, time.Millisecond); !errors.Is(err, errGrantBodiesFull) {
		t.Errorf("a grant past its share: %v; want %v", err, errGrantBodiesFull)
	}
	bb, err := b.take(ctx, "b", 40, 0)
	if err != nil {
		t.Fatalf("another grant within the total: %v", err)
	}
	if _, err := b.take(ctx, "c", 1, time.Millisecond); !errors.Is(err, errBodiesFull) {
		t.Errorf("past the total: %v; want %v", err, errBodiesFull)
	}
	a.shrink(20) // a keeps 20: room for 40 of a's and c's
	c, err := b.take(ctx, "c", 40, 0)
	if err != nil {
		t.Fatalf("take after a shrank: %v", err)
	}
	for _, h := range []*bodyHold{a, bb, c, c} { // a second release gives nothing back
		h.release()
	}
	if all, mine, waiting := b.inUse("a"); all != 0 || mine != 0 || waiting != 0 {
		t.Errorf("after every release: %d held, %d by a, %d waiting; want none", all, mine, waiting)
	}

	// Many takers at once: the bounds hold throughout. held counts what
	// the takers hold, taken out before each release.
	var mu sync.Mutex
	held, heldBy, worst := int64(0), map[string]int64{}, ""
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			grant := []string{"a", "b", "c"}[i%3]
			for range 50 {
				n := int64(1 + i%10)
				h, err := b.take(ctx, grant, n, time.Second)
				if err != nil {
					continue
				}
				mu.Lock()
				held += n
				heldBy[grant] += n
				if held > b.total || heldBy[grant] > b.perGrant {
					worst = fmt.Sprintf("%d held, %d by %s", held, heldBy[grant], grant)
				}
				held -= n
				heldBy[grant] -= n
				mu.Unlock()
				h.release()
			}
		})
	}
	wg.Wait()
	if worst != "" {
		t.Errorf("bounds %d (%d per grant) passed: %s", b.total, b.perGrant, worst)
	}
	if all, _, waiting := b.inUse("a"); all != 0 || waiting != 0 {
		t.Errorf("after the run: %d held, %d waiting; want none", all, waiting)
	}
}

// serveBody sends one POST to h as token, with body (and its length: -1
// for none) and returns the answer and how many bytes of body h read.
func serveBody(h http.Handler, token string, body io.Reader, length int64) (*httptest.ResponseRecorder, int64) {
	cr := &countingReader{r: body}
	req := httptest.NewRequest(http.MethodPost, "http://127.0.0.1/mcp", cr)
	req.ContentLength = length
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec, cr.n.Load()
}

// A body is read only after its token and its grant's budget were checked,
// never past the message limit and a little: a Content-Length past it is
// refused before a byte is read, a body without one as soon as it passes
// the bound; a message a little over the limit reaches the gate, which
// refuses it as an audited tool error.
func TestHTTPBodyReadWithinBounds(t *testing.T) {
	f := servertest.New(t, servertest.Options{})
	grantOf(t, f, "other").RequestsPerMinute = 1
	h := New(f.S, Options{})
	limit := int64(f.S.MaxMessageBytes())
	huge := int64(33 << 20)
	if rec, _ := serveBody(h, "other-token", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`), -1); rec.Code == http.StatusTooManyRequests {
		t.Fatalf("other's first request = %d; want it within its budget", rec.Code)
	}
	tests := []struct {
		name     string
		token    string
		body     io.Reader
		length   int64
		want     int
		maxRead  int64
		wantText string
	}{
		{"Content-Length past the limit", "local-token", endless{}, huge, http.StatusRequestEntityTooLarge, 0, "at most 8388608 bytes"},
		{"no Content-Length, past the limit", "local-token", endless{}, -1, http.StatusRequestEntityTooLarge, limit + bodySlack + 1, "message too large"},
		{"a wrong token", "wrong-token", endless{}, huge, http.StatusUnauthorized, 0, "unauthorized"},
		{"a wrong token, no Content-Length", "wrong-token", endless{}, -1, http.StatusUnauthorized, 0, "unauthorized"},
		{"beyond the budget", "other-token", endless{}, huge, http.StatusTooManyRequests, 0, catalog.TagRateLimited},
		{"beyond the budget, no Content-Length", "other-token", endless{}, -1, http.StatusTooManyRequests, bodyPeekBytes + 1, catalog.TagRateLimited},
	}
	for _, tt := range tests {
		rec, read := serveBody(h, tt.token, tt.body, tt.length)
		if rec.Code != tt.want || read > tt.maxRead || !strings.Contains(rec.Body.String(), tt.wantText) {
			t.Errorf("%s: %d %.200q after reading %d bytes; want %d with %q after at most %d", tt.name, rec.Code, rec.Body, read, tt.want, tt.wantText, tt.maxRead)
		}
	}
	if all, _, _ := h.bodies.inUse("local"); all != 0 {
		t.Errorf("%d bytes of bodies held after the refusals; want none", all)
	}

	// A little over the limit: read, and refused by the gate with the
	// call's id, in the audit log.
	over := mcptest.ToolCall(42, "list_vms", `{"pad":"`+strings.Repeat("x", int(limit))+`"}`)
	recs := len(f.Rec.Records())
	rec, _ := serveBody(h, "local-token", strings.NewReader(over), int64(len(over)))
	var r mcptest.Reply
	if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil || rec.Code != http.StatusOK || string(r.ID) != "42" || !mcptest.HasTag(r, catalog.TagInvalid) || !strings.Contains(r.Text(), strconv.Itoa(int(limit))) {
		t.Errorf("a call %d bytes over the limit = %d %.200q; want a %s tool error naming the limit, id 42", int64(len(over))-limit, rec.Code, rec.Body, catalog.TagInvalid)
	}
	if len(f.Rec.Records()) == recs {
		t.Errorf("the refused call left no audit record")
	}
}

// The bodies in memory are bounded in all and per grant: a body that does
// not fit waits, and is refused once its wait is over (429 for its grant's
// share, 503 for the server's, both with Retry-After) without a byte
// read; a small one that fits goes on; one waiting gets in as soon as room
// is given back.
func TestHTTPBodyBytesInFlight(t *testing.T) {
	f := servertest.New(t, servertest.Options{})
	h := New(f.S, Options{BodyBytes: 1, BodyBytesPerGrant: 1}) // raised to the largest body
	h.bodyWait = 2 * time.Second
	largest := h.maxBody() + bodyChunk
	if h.bodies.total != largest || h.bodies.perGrant != largest {
		t.Fatalf("bounds %d, %d; want both %d", h.bodies.total, h.bodies.perGrant, largest)
	}

	// A holds 8 MiB of local's share and of the total: its body never ends.
	pr, pw := io.Pipe()
	aDone := make(chan int)
	go func() {
		rec, _ := serveBody(h, "local-token", pr, 8<<20)
		aDone <- rec.Code
	}()
	waitFor(t, "A's body to take its bytes", func() bool { all, _, _ := h.bodies.inUse("local"); return all == 8<<20 })

	mb := int64(1 << 20)
	var wg sync.WaitGroup
	codes := map[string]*httptest.ResponseRecorder{}
	reads := map[string]int64{}
	var mu sync.Mutex
	for name, token := range map[string]string{"local": "local-token", "other": "other-token"} {
		wg.Go(func() {
			rec, n := serveBody(h, token, endless{}, mb)
			mu.Lock()
			codes[name], reads[name] = rec, n
			mu.Unlock()
		})
	}
	wg.Wait()
	for name, want := range map[string]int{"local": http.StatusTooManyRequests, "other": http.StatusServiceUnavailable} {
		rec := codes[name]
		if rec.Code != want || rec.Header().Get("Retry-After") == "" || reads[name] != 0 {
			t.Errorf("%s's 1 MiB body while A holds 8 MiB = %d (Retry-After %q) %.200q after reading %d bytes; want %d with Retry-After, nothing read",
				name, rec.Code, rec.Header().Get("Retry-After"), rec.Body, reads[name], want)
		}
	}
	small := mcptest.ToolCall(3, "list_vms", `{"pad":1}`)
	if rec, _ := serveBody(h, "other-token", strings.NewReader(small), int64(len(small))); rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), catalog.TagInvalid) {
		t.Errorf("a small body that fits = %d %.200q; want 200 and the gate's answer", rec.Code, rec.Body)
	}

	// One waiting gets in once A gives its bytes back.
	padded := mcptest.ToolCall(4, "list_vms", `{"pad":"`+strings.Repeat("x", int(mb))+`"}`)
	eDone := make(chan *httptest.ResponseRecorder)
	go func() {
		rec, _ := serveBody(h, "other-token", strings.NewReader(padded), int64(len(padded)))
		eDone <- rec
	}()
	waitFor(t, "E to wait for room", func() bool { _, _, waiting := h.bodies.inUse("other"); return waiting == 1 })
	pw.CloseWithError(errors.New("client gone"))
	if code := <-aDone; code != http.StatusBadRequest {
		t.Errorf("A, its body cut = %d; want 400", code)
	}
	var r mcptest.Reply
	if rec := <-eDone; rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &r) != nil || !mcptest.HasTag(r, catalog.TagInvalid) {
		t.Errorf("E, once A gave its bytes back = %d %.200q; want 200 and the gate's answer", rec.Code, rec.Body)
	}
	if all, _, waiting := h.bodies.inUse("local"); all != 0 || waiting != 0 {
		t.Errorf("%d bytes held, %d waiting at the end; want none", all, waiting)
	}
}

// A client that sends its whole body before it reads (Go's, most) gets
// the refusal of a body the server does not read, not a reset connection:
// the server reads and discards the rest for a while, keeping none of it.
func TestHTTPRefusalsReachTheClient(t *testing.T) {
	f := servertest.New(t, servertest.Options{})
	grantOf(t, f, "other").RequestsPerMinute = 1
	ts := httptest.NewServer(New(f.S, Options{}))
	defer ts.Close()
	big := bytes.Repeat([]byte("x"), 20<<20)
	post := func(token string, chunked bool) (int, string, error) {
		var rd io.Reader = bytes.NewReader(big)
		if chunked {
			rd = struct{ io.Reader }{rd}
		}
		req, _ := http.NewRequest(http.MethodPost, ts.URL+"/mcp", rd)
		if chunked {
			req.ContentLength = -1
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}
	if code, body, err := post("other-token", false); err != nil || code != http.StatusRequestEntityTooLarge {
		t.Fatalf("other's first request = %d %q, %v; want 413", code, body, err)
	}
	for i := range 5 {
		for _, tt := range []struct {
			token   string
			chunked bool
			want    int
			text    string
		}{
			{"local-token", false, http.StatusRequestEntityTooLarge, "message too large"},
			{"local-token", true, http.StatusRequestEntityTooLarge, "message too large"},
			{"other-token", false, http.StatusTooManyRequests, catalog.TagRateLimited},
			{"other-token", true, http.StatusTooManyRequests, catalog.TagRateLimited},
		} {
			code, body, err := post(tt.token, tt.chunked)
			if err != nil || code != tt.want || !strings.Contains(body, tt.text) {
				t.Errorf("20 MiB as %s (chunked %v), try %d = %d %.100q, %v; want %d %q", tt.token, tt.chunked, i, code, body, err, tt.want, tt.text)
			}
		}
	}
}

// waitFor polls cond until it holds, failing t after 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 20 s for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
