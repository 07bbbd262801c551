package server

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// slowPost sends the headers and the first bytes of a body of n bytes, then
// nothing more, and returns the status line the server answers with ("" if
// it closed the connection without one) and how long that took.
func slowPost(t *testing.T, addr, path string, hdr map[string]string, n int) (string, time.Duration) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var b strings.Builder
	fmt.Fprintf(&b, "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n", path, n)
	for k, v := range hdr {
		fmt.Fprintf(&b, "%s: %s\r\n", k, v)
	}
	b.WriteString("\r\n{\"jsonrpc\":")
	start := time.Now()
	if _, err := io.WriteString(c, b.String()); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	line, _ := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), time.Since(start)
}

// An authenticated client that holds a request body open is cut off once
// the body timeout passes: 408, the connection closed.
func TestHTTPBodyTimeout(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	f.s.httpOpts.BodyTimeout = 300 * time.Millisecond
	ts := httptest.NewServer(f.s.Handler())
	defer ts.Close()
	addr := strings.TrimPrefix(ts.URL, "http://")
	status, took := slowPost(t, addr, "/mcp", map[string]string{"Authorization": "Bearer local-token", "Content-Type": "application/json"}, 1000)
	if !strings.HasPrefix(status, "HTTP/1.1 408") {
		t.Errorf("a body held open: status line %q after %v; want 408", status, took)
	}
	if took < 300*time.Millisecond {
		t.Errorf("cut off after %v; want no earlier than the timeout of 300ms", took)
	}
	// A body that arrives in time is served.
	if r, sid := post(t, ts.URL+"/mcp", "local-token", "", initMsg); sid == "" || r.Error != nil {
		t.Errorf("initialize = %+v, session %q; want a session", r.Error, sid)
	}
}

// LimitBodyTime guards every handler of the listener: a slow body is cut
// off, while a response that takes longer than the timeout after its body
// arrived is not.
func TestLimitBodyTime(t *testing.T) {
	const d = 200 * time.Millisecond
	h := LimitBodyTime(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			if bodyTimedOut(err) {
				http.Error(w, "timed out", http.StatusRequestTimeout)
			} else {
				http.Error(w, err.Error(), http.StatusBadRequest)
			}
			return
		}
		<-time.After(3 * d) // a slow answer, well past the body deadline
		fmt.Fprintf(w, "got %d bytes", len(b))
	}), d)
	ts := httptest.NewServer(h)
	defer ts.Close()
	status, took := slowPost(t, strings.TrimPrefix(ts.URL, "http://"), "/ui/login", nil, 500)
	if !strings.HasPrefix(status, "HTTP/1.1 408") {
		t.Errorf("slow body: %q after %v; want 408", status, took)
	}
	resp, err := http.Post(ts.URL, "text/plain", strings.NewReader("hello"))
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != "got 5 bytes" {
		t.Errorf("a quick body with a slow answer = %d %q; want 200 \"got 5 bytes\"", resp.StatusCode, body)
	}
}
