package mcphttp

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/server/mcptest"
	"github.com/vmgate/vmgate/server/servertest"
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
	f := servertest.New(t, servertest.Options{})
	ts := httptest.NewServer(New(f.S, Options{BodyTimeout: 300 * time.Millisecond}))
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
	if r, sid := mcptest.Post(t, ts.URL+"/mcp", "local-token", "", mcptest.InitMsg); sid == "" || r.Error != nil {
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

// Issue 37: a browser page served from this machine's loopback may call a
// loopback listener (the MCP specification's rule against DNS rebinding:
// refuse non-localhost origins, accept localhost ones); every other origin
// is refused unless listed, and the token is required either way.
func TestHTTPOrigin(t *testing.T) {
	f := servertest.New(t, servertest.Options{})
	h := New(f.S, Options{AllowedOrigins: []string{"https://ops.example", "http://localhost:6274"}})
	ts := httptest.NewServer(h) // on 127.0.0.1
	defer ts.Close()
	port := ts.URL[strings.LastIndexByte(ts.URL, ':')+1:]
	tests := []struct {
		name    string
		origins []string
		token   string
		want    int
	}{
		{"no Origin", nil, "local-token", http.StatusOK},
		{"another site", []string{"http://evil.example"}, "local-token", http.StatusForbidden},
		{"another site, wrong token", []string{"http://evil.example"}, "nope", http.StatusForbidden},
		{"localhost, this port", []string{"http://localhost:" + port}, "local-token", http.StatusOK},
		{"localhost, another port", []string{"http://localhost:5173"}, "local-token", http.StatusOK},
		{"127.0.0.1", []string{"http://127.0.0.1:" + port}, "local-token", http.StatusOK},
		{"[::1], https, no port", []string{"https://[::1]"}, "local-token", http.StatusOK},
		{"localhost, wrong token", []string{"http://localhost:" + port}, "nope", http.StatusUnauthorized},
		{"localhost, no token", []string{"http://localhost:" + port}, "", http.StatusUnauthorized},
		{"listed", []string{"https://ops.example"}, "local-token", http.StatusOK},
		{"listed, another port", []string{"https://ops.example:8443"}, "local-token", http.StatusForbidden},
		{"a rebinding name", []string{"http://localhost.evil.example:" + port}, "local-token", http.StatusForbidden},
		{"localhost with a path", []string{"http://localhost:" + port + "/x"}, "local-token", http.StatusForbidden},
		{"null", []string{"null"}, "local-token", http.StatusForbidden},
		{"two Origins", []string{"http://localhost:" + port, "http://localhost:" + port}, "local-token", http.StatusForbidden},
	}
	for _, tt := range tests {
		hdr := map[string][]string{"Origin": tt.origins}
		if tt.token != "" {
			hdr["Authorization"] = []string{"Bearer " + tt.token}
		}
		if got := mcptest.InitStatus(t, ts.URL+"/mcp", hdr); got != tt.want {
			t.Errorf("%s: Origin %q on a loopback listener = %d; want %d", tt.name, tt.origins, got, tt.want)
		}
	}

	// A request that came in on another address: a loopback origin is some
	// other machine's, and passes only if listed.
	for _, tt := range []struct {
		local, origin string
		want          int
	}{
		{"192.0.2.5:8707", "http://localhost:8707", http.StatusForbidden},
		{"192.0.2.5:8707", "http://127.0.0.1:8707", http.StatusForbidden},
		{"[2001:db8::5]:8707", "http://[::1]:8707", http.StatusForbidden},
		{"192.0.2.5:8707", "http://localhost:6274", http.StatusOK}, // listed
		{"192.0.2.5:8707", "https://ops.example", http.StatusOK},
		{"[::ffff:127.0.0.1]:8707", "http://localhost:8707", http.StatusOK},
	} {
		req := httptest.NewRequest(http.MethodPost, "http://127.0.0.1:8707/mcp", strings.NewReader(mcptest.InitMsg))
		local, err := net.ResolveTCPAddr("tcp", tt.local)
		if err != nil {
			t.Fatal(err)
		}
		req = req.WithContext(context.WithValue(req.Context(), http.LocalAddrContextKey, local))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", "Bearer local-token")
		req.Header.Set("Origin", tt.origin)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != tt.want {
			t.Errorf("Origin %q on a request to %s = %d %q; want %d", tt.origin, tt.local, rec.Code, rec.Body, tt.want)
		}
	}
}
